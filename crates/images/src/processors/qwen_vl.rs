//! Qwen2-VL, Qwen2.5-VL and Qwen3-VL as mlx-vlm 0.7.0 preprocesses them: its own NumPy port
//! (`mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py`, `Qwen3VLImageProcessor`), which mlx-vlm
//! uses for all three instead of transformers' `Qwen2VLImageProcessor`. The port follows
//! transformers (same `smart_resize`, BICUBIC, patch order) with these differences, all matched
//! here: the image is converted with PIL's `convert("RGB")` only (no colour-key compositing);
//! rescale multiplies in f32, not f64; the mean/std default is 0.5 (real checkpoints set CLIP's);
//! `patch_size` defaults to 14 for Qwen2/2.5-VL and 16 for Qwen3-VL.

use std::path::Path;

use serde_json::{Map, Value};

use super::hf::{read_json, Fields, Rescale};
use super::{PixelValues, ProcessedImages};
use crate::error::{ImageError, Result};
use crate::resize::{resize, Filter};
use crate::RgbImage;

/// A Qwen-VL image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenVlImageProcessor {
    pub patch_size: u32,
    pub temporal_patch_size: u32,
    pub merge_size: u32,
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub rescale: Rescale,
}

impl QwenVlImageProcessor {
    /// mlx-vlm's `_qwen_vl_image_kwargs`: `preprocessor_config.json` updated with
    /// `processor_config.json`'s `image_processor`; `size.shortest_edge`/`longest_edge` give
    /// min/max pixels, and explicit `min_pixels`/`max_pixels` win over them.
    pub fn from_model_dir(dir: &Path, default_patch_size: u32) -> Result<Self> {
        let mut config = match read_json(&dir.join("preprocessor_config.json"))? {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        if let Some(Value::Object(proc)) = read_json(&dir.join("processor_config.json"))? {
            if let Some(Value::Object(ip)) = proc.get("image_processor") {
                config.extend(ip.clone());
            }
        }
        Self::from_config(&config, default_patch_size)
    }

    /// From a merged config object (see [`Self::from_model_dir`]).
    pub fn from_config(config: &Map<String, Value>, default_patch_size: u32) -> Result<Self> {
        let f = Fields(config);
        let mut min_pixels = 56 * 56;
        let mut max_pixels = 14 * 14 * 4 * 1280;
        // mlx-vlm skips null sizes (`is not None`).
        let pixels = |map: &Map<String, Value>, key: &str, current: u64| -> Result<u64> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(current),
                Some(_) => Fields(map).u64(key, current),
            }
        };
        if let Some(Value::Object(size)) = config.get("size") {
            min_pixels = pixels(size, "shortest_edge", min_pixels)?;
            max_pixels = pixels(size, "longest_edge", max_pixels)?;
        }
        min_pixels = pixels(config, "min_pixels", min_pixels)?;
        max_pixels = pixels(config, "max_pixels", max_pixels)?;
        Ok(Self {
            patch_size: f.u32("patch_size", default_patch_size)?,
            temporal_patch_size: f.u32("temporal_patch_size", 2)?,
            merge_size: f.u32("merge_size", 2)?,
            min_pixels,
            max_pixels,
            rescale: Rescale {
                do_rescale: f.bool("do_rescale", true)?,
                factor: f.f64("rescale_factor", 1.0 / 255.0)?,
                do_normalize: f.bool("do_normalize", true)?,
                // `image_mean or [0.5] * 3`: null also gives the default.
                mean: if f.is_null("image_mean") {
                    [0.5; 3]
                } else {
                    f.triple("image_mean", [0.5; 3])?
                },
                std: if f.is_null("image_std") {
                    [0.5; 3]
                } else {
                    f.triple("image_std", [0.5; 3])?
                },
            },
        })
    }

    /// The size an image is resized to, `(height, width)`.
    pub fn target_size(&self, height: u32, width: u32) -> Result<(u32, u32)> {
        smart_resize(
            height,
            width,
            self.patch_size * self.merge_size,
            self.min_pixels,
            self.max_pixels,
        )
    }

    /// The image resized (BICUBIC, 8 bits), as mlx-vlm's `_resize_video_frames` gives it.
    pub fn resized(&self, img: &RgbImage) -> Result<RgbImage> {
        let (h, w) = self.target_size(img.height, img.width)?;
        Ok(resize(img, w, h, Filter::Bicubic))
    }

    /// `pixel_values` `[sum of grid_t*grid_h*grid_w, 3 * temporal_patch_size * patch^2]` and
    /// `image_grid_thw`, images concatenated in order.
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        let (ps, tps, ms) = (
            self.patch_size as usize,
            self.temporal_patch_size as usize,
            self.merge_size as usize,
        );
        let row_len = 3 * tps * ps * ps;
        let mut data = Vec::new();
        let mut grids = Vec::new();
        for img in images {
            let img = self.resized(img)?;
            let (h, w) = (img.height as usize, img.width as usize);
            let (gh, gw) = (h / ps, w / ps);
            // CHW floats first.
            let plane = h * w;
            let mut chw = vec![0f32; 3 * plane];
            for (i, px) in img.pixels.chunks_exact(3).enumerate() {
                for c in 0..3 {
                    chw[c * plane + i] = self.rescale.f32_value(px[c], c);
                }
            }
            // Patch order (both HF and mlx-vlm): blocks of merge_size x merge_size patches in
            // row-major block order, row-major inside a block; each patch row is
            // [channel][temporal copy][patch y][patch x].
            for bh in 0..gh / ms {
                for bw in 0..gw / ms {
                    for mh in 0..ms {
                        for mw in 0..ms {
                            let (py, px) = ((bh * ms + mh) * ps, (bw * ms + mw) * ps);
                            for c in 0..3 {
                                for _t in 0..tps {
                                    for y in 0..ps {
                                        let start = c * plane + (py + y) * w + px;
                                        data.extend_from_slice(&chw[start..start + ps]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            grids.push([1, gh, gw]);
        }
        let rows = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        Ok(ProcessedImages {
            pixel_values: PixelValues {
                data,
                shape: vec![rows, row_len],
            },
            image_grid_thw: grids,
            ..ProcessedImages::default()
        })
    }
}

/// transformers' (and mlx-vlm's) `smart_resize`: both sides multiples of `factor`, the pixel
/// count within `[min_pixels, max_pixels]`, the aspect ratio kept as well as possible. Python's
/// `round` rounds halves to even.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32)> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if h.max(w) / h.min(w) > 200.0 {
        return Err(ImageError::BadImageSize {
            width,
            height,
            reason: format!(
                "absolute aspect ratio must be smaller than 200, got {}",
                h.max(w) / h.min(w)
            ),
        });
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < 1.0 || w_bar < 1.0 {
        return Err(ImageError::BadImageSize {
            width,
            height,
            reason: "too small to resize (rounds to 0 pixels)".into(),
        });
    }
    Ok((h_bar as u32, w_bar as u32))
}
