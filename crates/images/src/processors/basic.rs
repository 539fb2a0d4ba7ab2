//! The plain `PilBackend` pipeline of transformers (resize, center crop, rescale, normalize; CHW
//! float32), with the class defaults of `Gemma3ImageProcessor`, `CLIPImageProcessor` and
//! `SiglipImageProcessor`. mlx-vlm loads all three with `use_fast=False`, i.e. this backend.

use serde_json::{Map, Value};

use super::hf::{center_crop, crop, Fields, Rescale, Size};
use super::{PixelValues, ProcessedImages};
use crate::error::{ImageError, Result};
use crate::resize::{resize, Filter};
use crate::RgbImage;

/// transformers' `IMAGENET_STANDARD_MEAN` / `_STD`.
pub const IMAGENET_STANDARD_MEAN: [f64; 3] = [0.5, 0.5, 0.5];
pub const IMAGENET_STANDARD_STD: [f64; 3] = [0.5, 0.5, 0.5];
/// transformers' `OPENAI_CLIP_MEAN` / `_STD`.
pub const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
pub const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// Which class's defaults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BasicKind {
    /// `Gemma3ImageProcessor`: 224x224 (896 in real checkpoints), BILINEAR, mean/std 0.5.
    Gemma3,
    /// `CLIPImageProcessor`: shortest edge 224, center crop 224, BICUBIC, CLIP mean/std.
    Clip,
    /// `SiglipImageProcessor`: 224x224, BICUBIC, mean/std 0.5.
    Siglip,
}

/// A processor of the plain pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct BasicImageProcessor {
    pub kind: BasicKind,
    pub do_resize: bool,
    pub size: Size,
    pub resample: Filter,
    pub do_center_crop: bool,
    pub crop_size: Size,
    pub rescale: Rescale,
    /// Gemma 3's pan and scan (`do_pan_and_scan`), off unless the config turns it on.
    pub pan_and_scan: Option<PanAndScan>,
    /// transformers' `do_convert_rgb`: composite a colour-keyed image onto white
    /// ([`RgbImage::hf_convert_to_rgb`]). Off for `null` (Gemma 3's checkpoints).
    pub do_convert_rgb: bool,
}

impl BasicImageProcessor {
    /// From the settings of [`super::hf::hf_config`] (or any `preprocessor_config.json` object).
    pub fn from_config(kind: BasicKind, config: &Map<String, Value>) -> Result<Self> {
        let f = Fields(config);
        let (size, square, resample, crop, mean, std) = match kind {
            BasicKind::Gemma3 => (
                Size::HeightWidth {
                    height: 224,
                    width: 224,
                },
                true,
                Filter::Bilinear,
                false,
                IMAGENET_STANDARD_MEAN,
                IMAGENET_STANDARD_STD,
            ),
            BasicKind::Clip => (
                Size::ShortestEdge(224),
                false,
                Filter::Bicubic,
                true,
                OPENAI_CLIP_MEAN,
                OPENAI_CLIP_STD,
            ),
            BasicKind::Siglip => (
                Size::HeightWidth {
                    height: 224,
                    width: 224,
                },
                false,
                Filter::Bicubic,
                false,
                IMAGENET_STANDARD_MEAN,
                IMAGENET_STANDARD_STD,
            ),
        };
        let pan_and_scan = if kind == BasicKind::Gemma3 && f.bool("do_pan_and_scan", false)? {
            // transformers has no defaults for these (None fails in Python): required.
            let required = |key: &str| -> Result<f64> {
                match config.get(key).and_then(Value::as_f64) {
                    Some(x) => Ok(x),
                    None => Err(ImageError::Unsupported {
                        field: key.into(),
                        reason: "do_pan_and_scan needs a number here".into(),
                    }),
                }
            };
            Some(PanAndScan {
                min_crop_size: required("pan_and_scan_min_crop_size")? as u32,
                max_num_crops: required("pan_and_scan_max_num_crops")? as u32,
                min_ratio_to_activate: required("pan_and_scan_min_ratio_to_activate")?,
            })
        } else {
            None
        };
        let mut size = f.size("size", size, square)?;
        // CLIP's `use_square_size`: size becomes shortest_edge x shortest_edge.
        if kind == BasicKind::Clip && f.bool("use_square_size", false)? {
            if let Size::ShortestEdge(n) = size {
                size = Size::HeightWidth {
                    height: n,
                    width: n,
                };
            }
        }
        let crop_default = Size::HeightWidth {
            height: 224,
            width: 224,
        };
        let do_pad = f.bool("do_pad", false)?;
        if do_pad {
            return Err(ImageError::Unsupported {
                field: "do_pad".into(),
                reason: "padding a batch is not implemented for this processor".into(),
            });
        }
        Ok(Self {
            kind,
            pan_and_scan,
            do_resize: f.bool("do_resize", true)?,
            size,
            resample: f.filter("resample", resample)?,
            do_center_crop: f.bool("do_center_crop", crop)?,
            crop_size: f.size("crop_size", crop_default, true)?,
            do_convert_rgb: f.bool("do_convert_rgb", true)?,
            rescale: Rescale {
                do_rescale: f.bool("do_rescale", true)?,
                factor: f.f64("rescale_factor", 1.0 / 255.0)?,
                do_normalize: f.bool("do_normalize", true)?,
                mean: f.triple("image_mean", mean)?,
                std: f.triple("image_std", std)?,
            },
        })
    }

    /// One image through the pipeline, as 8 bits (before rescale): what PIL's resize gives.
    pub fn resized(&self, img: &RgbImage) -> Result<RgbImage> {
        self.resize_and_crop(self.converted(img))
    }

    /// transformers' `convert_to_rgb` when `do_convert_rgb`.
    fn converted(&self, img: &RgbImage) -> RgbImage {
        if self.do_convert_rgb {
            img.hf_convert_to_rgb()
        } else {
            img.clone()
        }
    }

    fn resize_and_crop(&self, mut img: RgbImage) -> Result<RgbImage> {
        if self.do_resize {
            let (h, w) = self.size.target(img.height, img.width)?;
            img = resize(&img, w, h, self.resample);
        }
        // Gemma 3's `_preprocess` has no center crop.
        if self.do_center_crop && self.kind != BasicKind::Gemma3 {
            let Size::HeightWidth { height, width } = self.crop_size else {
                return Err(ImageError::Unsupported {
                    field: "crop_size".into(),
                    reason: "must have height and width".into(),
                });
            };
            img = center_crop(&img, height, width);
        }
        Ok(img)
    }

    /// `pixel_values` of shape `[n, 3, H, W]` (all images must come out the same size, as
    /// transformers' stacking requires) and `num_crops`: with pan and scan, each image is
    /// followed by its crops (n = images + crops), else n = images and every count is 0.
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        let mut data = Vec::new();
        let mut hw = None;
        let mut num_crops = Vec::with_capacity(images.len());
        let mut n = 0;
        for img in images {
            let img = self.converted(img);
            let crops = match &self.pan_and_scan {
                Some(pas) => pas.crops(&img),
                None => Vec::new(),
            };
            num_crops.push(crops.len());
            for img in std::iter::once(img).chain(crops) {
                let img = self.resize_and_crop(img)?;
                match hw {
                    None => hw = Some((img.height, img.width)),
                    Some(prev) if prev != (img.height, img.width) => {
                        return Err(ImageError::BadImageSize {
                            width: img.width,
                            height: img.height,
                            reason: format!(
                                "processed images differ in size ({}x{} and {}x{}); \
                                 process them one at a time",
                                prev.1, prev.0, img.width, img.height
                            ),
                        })
                    }
                    _ => {}
                }
                self.rescale.hf_chw(&img, &mut data);
                n += 1;
            }
        }
        let (h, w) = hw.unwrap_or((0, 0));
        Ok(ProcessedImages {
            pixel_values: PixelValues {
                data,
                shape: vec![n, 3, h as usize, w as usize],
            },
            num_crops,
            ..ProcessedImages::default()
        })
    }
}

/// Gemma 3's pan and scan: an image much wider than tall (or taller than wide) is also cut into
/// 2..=`max_num_crops` equal crops across its long side, each processed like an image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PanAndScan {
    pub min_crop_size: u32,
    pub max_num_crops: u32,
    pub min_ratio_to_activate: f64,
}

impl PanAndScan {
    /// transformers' `Gemma3ImageProcessorPil.pan_and_scan`: the crops, row-major, or none.
    pub fn crops(&self, img: &RgbImage) -> Vec<RgbImage> {
        let (w, h) = (img.width as f64, img.height as f64);
        let min_crop = self.min_crop_size as f64;
        // int(floor(long / short + 0.5)), at most long // min_crop, then clamped to
        // [2, max_num_crops].
        let count = |long: f64, short: f64| -> u32 {
            let n = ((long / short + 0.5).floor() as u32).min((long / min_crop).floor() as u32);
            n.max(2).min(self.max_num_crops)
        };
        let (cols, rows) = if img.width >= img.height {
            if w / h < self.min_ratio_to_activate {
                return Vec::new();
            }
            (count(w, h), 1)
        } else {
            if h / w < self.min_ratio_to_activate {
                return Vec::new();
            }
            (1, count(h, w))
        };
        let crop_w = (w / cols as f64).ceil() as u32;
        let crop_h = (h / rows as f64).ceil() as u32;
        if crop_w.min(crop_h) < self.min_crop_size {
            return Vec::new();
        }
        let mut out = Vec::with_capacity((rows * cols) as usize);
        for r in 0..rows {
            for c in 0..cols {
                out.push(crop(img, c * crop_w, r * crop_h, crop_w, crop_h));
            }
        }
        out
    }
}
