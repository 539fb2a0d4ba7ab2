//! The plain `PilBackend` pipeline of transformers (resize, center crop, rescale, normalize; CHW
//! float32), with the class defaults of `Gemma3ImageProcessor`, `CLIPImageProcessor` and
//! `SiglipImageProcessor`. mlx-vlm loads all three with `use_fast=False`, i.e. this backend.

use serde_json::{Map, Value};

use super::hf::{center_crop, Fields, Rescale, Size};
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
        if kind == BasicKind::Gemma3 && f.bool("do_pan_and_scan", false)? {
            return Err(ImageError::Unsupported {
                field: "do_pan_and_scan".into(),
                reason: "pan and scan is not implemented; set it to false or null \
                         (mlx-vlm's default is off)"
                    .into(),
            });
        }
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
        let mut img = if self.do_convert_rgb {
            img.hf_convert_to_rgb()
        } else {
            img.clone()
        };
        if self.do_resize {
            let (h, w) = self.size.target(img.height, img.width)?;
            img = resize(&img, w, h, self.resample);
        }
        if self.do_center_crop {
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

    /// `pixel_values` of shape `[n_images, 3, H, W]` (all images must come out the same size,
    /// as transformers' stacking requires) and `num_crops` (all 0: no pan and scan).
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        let mut data = Vec::new();
        let mut hw = None;
        for img in images {
            let img = self.resized(img)?;
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
        }
        let (h, w) = hw.unwrap_or((0, 0));
        Ok(ProcessedImages {
            pixel_values: PixelValues {
                data,
                shape: vec![images.len(), 3, h as usize, w as usize],
            },
            num_crops: vec![0; images.len()],
            ..ProcessedImages::default()
        })
    }
}
