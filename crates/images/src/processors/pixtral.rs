//! Pixtral (Mistral 3: Mistral Small 3.x, Devstral) as mlx-vlm 0.7.0 preprocesses it: its own
//! PIL port (`mlx_vlm/models/pixtral/image_processing_pixtral.py`, `PixtralImageProcessor`),
//! called by `Mistral3Processor` with `patch_size = patch_size * spatial_merge_size`.
//!
//! Each image is resized (BICUBIC by default) so that it fits `size.longest_edge` and both sides
//! are multiples of that patch: `ratio = max(h / edge, w / edge)`; above 1 both sides are divided
//! by it and floored; then each side is rounded up to a multiple of the patch. Rescale and
//! normalize in f32 (NumPy's arithmetic: the Python floats cast to the array's f32); CHW; the
//! images of one prompt zero-padded at the bottom and right to the largest height and width and
//! stacked. The prompt gets, per image, `h / patch` rows of `w / patch` image tokens, the rows
//! separated by a break token and the last followed by an end token.

use std::path::Path;

use serde_json::{Map, Value};

use super::hf::{hf_config, read_json, Fields, Rescale};
use super::{PixelValues, ProcessedImages};
use crate::error::{ImageError, Result};
use crate::resize::{resize, Filter};
use crate::RgbImage;

const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// A Pixtral image processor, with the patch the processor passes it (merge included).
#[derive(Debug, Clone, PartialEq)]
pub struct PixtralImageProcessor {
    /// `size`: `(height, width)` an image must fit (`longest_edge` for both).
    pub max_size: (u32, u32),
    /// The patch both sides become multiples of: the tower's patch times the spatial merge.
    pub patch: u32,
    pub do_resize: bool,
    pub filter: Filter,
    pub rescale: Rescale,
}

impl PixtralImageProcessor {
    /// As mlx-vlm's `Mistral3Processor.from_pretrained` builds it from a model directory: the
    /// image processor's settings ([`hf_config`], with `size` and `patch_size` from
    /// `processor_config.json` when the former lacks them); the patch is config.json's
    /// `vision_config.patch_size` (else the image processor's, else `processor_config.json`'s,
    /// else 16) times config.json's `spatial_merge_size` (else `processor_config.json`'s, else 1).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let mut config = hf_config(dir)?;
        let proc = match read_json(&dir.join("processor_config.json"))? {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        for key in ["size", "patch_size"] {
            if let (false, Some(v)) = (config.contains_key(key), proc.get(key)) {
                config.insert(key.to_owned(), v.clone());
            }
        }
        let model = match read_json(&dir.join("config.json"))? {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let int = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as u32);
        let side = |v: Option<&Value>| match v {
            Some(Value::Object(p)) => int(p.get("height")).or(int(p.get("width"))),
            other => int(other),
        };
        let patch = int(model.get("vision_config").and_then(|v| v.get("patch_size")))
            .or_else(|| side(config.get("patch_size")))
            .or_else(|| int(proc.get("patch_size")))
            .unwrap_or(16);
        let merge = int(model.get("spatial_merge_size"))
            .or_else(|| int(proc.get("spatial_merge_size")))
            .unwrap_or(1);
        Self::from_config(&config, patch.max(1) * merge.max(1))
    }

    /// From the image processor's settings and the patch the processor passes.
    pub fn from_config(config: &Map<String, Value>, patch: u32) -> Result<Self> {
        let f = Fields(config);
        let edge = |v: &Value| v.as_u64().map(|n| n as u32);
        let max_size = match config.get("size") {
            Some(Value::Object(s)) if s.get("longest_edge").is_some_and(|v| !v.is_null()) => {
                let e = edge(&s["longest_edge"]).unwrap_or(1024);
                (e, e)
            }
            Some(Value::Object(s)) => match (
                s.get("height").and_then(edge),
                s.get("width").and_then(edge),
            ) {
                (Some(h), Some(w)) => (h, w),
                _ => (1024, 1024),
            },
            Some(Value::Array(a)) if a.len() == 1 => {
                (edge(&a[0]).unwrap_or(1024), edge(&a[0]).unwrap_or(1024))
            }
            Some(Value::Array(a)) if a.len() >= 2 => {
                (edge(&a[0]).unwrap_or(1024), edge(&a[1]).unwrap_or(1024))
            }
            Some(v) => (edge(v).unwrap_or(1024), edge(v).unwrap_or(1024)),
            None => (1024, 1024),
        };
        let mean_or = |key: &str, default: [f64; 3]| match f.is_null(key) {
            true => Ok(default),
            false => f.triple(key, default),
        };
        Ok(Self {
            max_size,
            patch,
            do_resize: f.bool("do_resize", true)?,
            // mlx-vlm's port: `None` is BICUBIC too.
            filter: match f.is_null("resample") {
                true => Filter::Bicubic,
                false => f.filter("resample", Filter::Bicubic)?,
            },
            rescale: Rescale {
                do_rescale: f.bool("do_rescale", true)?,
                factor: f.f64("rescale_factor", 1.0 / 255.0)?,
                do_normalize: f.bool("do_normalize", true)?,
                mean: mean_or("image_mean", CLIP_MEAN)?,
                std: mean_or("image_std", CLIP_STD)?,
            },
        })
    }

    /// `get_resize_output_image_size`: the `(height, width)` an image of this size becomes. An
    /// image so thin that a side floors to 0 is refused (mlx-vlm's resize fails on it).
    pub fn target_size(&self, height: u32, width: u32) -> Result<(u32, u32)> {
        let (mut h, mut w) = (height, width);
        let (max_h, max_w) = self.max_size;
        let ratio = (h as f64 / max_h as f64).max(w as f64 / max_w as f64);
        if ratio > 1.0 {
            h = (h as f64 / ratio).floor() as u32;
            w = (w as f64 / ratio).floor() as u32;
        }
        if h == 0 || w == 0 {
            return Err(ImageError::BadImageSize {
                width,
                height,
                reason: format!(
                    "fitted into {max_w}x{max_h} a side becomes 0 pixels; send a less \
                     elongated image"
                ),
            });
        }
        let p = self.patch;
        let up = |n: u32| ((n - 1) / p + 1) * p;
        Ok((up(h), up(w)))
    }

    /// Image tokens per row and rows of an image, after resizing (`(h / patch, w / patch)`).
    pub fn token_grid(&self, img: &RgbImage) -> Result<(usize, usize)> {
        let (h, w) = match self.do_resize {
            true => self.target_size(img.height, img.width)?,
            false => (img.height, img.width),
        };
        Ok(((h / self.patch) as usize, (w / self.patch) as usize))
    }

    /// `pixel_values` `(images, 3, max height, max width)` and each image's size before padding
    /// (`image_sizes`, `[height, width]`).
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        let resized = images
            .iter()
            .map(|img| match self.do_resize {
                true => {
                    let (h, w) = self.target_size(img.height, img.width)?;
                    Ok(resize(img, w, h, self.filter))
                }
                false => Ok(img.clone()),
            })
            .collect::<Result<Vec<RgbImage>>>()?;
        let max_h = resized.iter().map(|i| i.height as usize).max().unwrap_or(0);
        let max_w = resized.iter().map(|i| i.width as usize).max().unwrap_or(0);
        let plane = max_h * max_w;
        let mut data = vec![0f32; resized.len() * 3 * plane];
        for (n, img) in resized.iter().enumerate() {
            let w = img.width as usize;
            for (i, px) in img.pixels.chunks_exact(3).enumerate() {
                let (y, x) = (i / w, i % w);
                for c in 0..3 {
                    data[(n * 3 + c) * plane + y * max_w + x] = self.rescale.f32_value(px[c], c);
                }
            }
        }
        Ok(ProcessedImages {
            pixel_values: PixelValues {
                data,
                shape: vec![resized.len(), 3, max_h, max_w],
            },
            image_sizes: resized
                .iter()
                .map(|i| [i.height as usize, i.width as usize])
                .collect(),
            ..ProcessedImages::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(edge: u32, patch: u32) -> PixtralImageProcessor {
        let config = serde_json::json!({"size": {"longest_edge": edge}});
        PixtralImageProcessor::from_config(config.as_object().unwrap(), patch).unwrap()
    }

    #[test]
    fn sizes_fit_the_longest_edge_then_round_up_to_the_patch() {
        let p = processor(1540, 28);
        // 800x600 fits: rounded up to multiples of 28.
        assert_eq!(p.target_size(600, 800).unwrap(), (616, 812));
        // 3000x1000: ratio 3000/1540, floored, then rounded up.
        let ratio = 3000.0 / 1540.0;
        let (h, w) = ((1000.0 / ratio) as u32, (3000.0 / ratio) as u32);
        let want = (((h - 1) / 28 + 1) * 28, ((w - 1) / 28 + 1) * 28);
        assert_eq!(p.target_size(1000, 3000).unwrap(), want);
        // A side of 1 pixel still gets one patch; one that fits to 0 pixels is refused.
        assert_eq!(p.target_size(1, 5).unwrap(), (28, 28));
        assert!(p.target_size(1, 2000).is_err());
    }

    #[test]
    fn images_are_padded_to_the_largest_and_sizes_kept() {
        let p = processor(64, 16);
        let small = RgbImage::new(10, 20, vec![255; 10 * 20 * 3]);
        let big = RgbImage::new(40, 30, vec![0; 40 * 30 * 3]);
        let out = p.preprocess(&[small, big]).unwrap();
        assert_eq!(out.pixel_values.shape, vec![2, 3, 32, 48]);
        assert_eq!(out.image_sizes, vec![[32, 16], [32, 48]]);
        // The small image's padding is zero, its pixels are not.
        let plane = 32 * 48;
        assert_ne!(out.pixel_values.data[0], 0.0);
        assert_eq!(out.pixel_values.data[20], 0.0);
        assert_eq!(out.pixel_values.data[plane - 1], 0.0);
    }
}
