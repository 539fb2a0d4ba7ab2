//! Pixel tensors per model family, as mlx-vlm 0.7.0 computes them: transformers 5.24's PIL
//! backend for Gemma 3, Idefics3/SmolVLM and LLaVA (CLIP or SigLIP), mlx-vlm's own NumPy port for
//! Qwen2-VL, Qwen2.5-VL and Qwen3-VL. Which of these a model uses: [`Processor::from_model_dir`].

use std::path::Path;

pub mod basic;
pub mod hf;
pub mod idefics3;
pub mod pixtral;
pub mod qwen_vl;

use crate::error::{ImageError, Result};
use crate::RgbImage;

pub use basic::{BasicImageProcessor, BasicKind};
pub use idefics3::Idefics3ImageProcessor;
pub use pixtral::PixtralImageProcessor;
pub use qwen_vl::{smart_resize, QwenVlImageProcessor};

/// A float32 tensor, row-major.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PixelValues {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

/// A 0/1 mask, row-major (transformers gives int64).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mask {
    pub data: Vec<u8>,
    pub shape: Vec<usize>,
}

/// What a processor returns: `pixel_values` and the family's extras (empty where they do not
/// apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessedImages {
    pub pixel_values: PixelValues,
    /// Gemma 3: pan-and-scan crops per image (always 0 here).
    pub num_crops: Vec<usize>,
    /// Qwen-VL: `[t, h, w]` in patches, per image.
    pub image_grid_thw: Vec<[usize; 3]>,
    /// Idefics3/SmolVLM: ones over real pixels of each tile.
    pub pixel_attention_mask: Option<Mask>,
    /// Idefics3/SmolVLM: tile rows and columns per image (0 and 0: one tile, no global image);
    /// the prompt's image tokens depend on them.
    pub rows: Vec<usize>,
    pub cols: Vec<usize>,
    /// Pixtral: each image's `[height, width]` before the batch's padding.
    pub image_sizes: Vec<[usize; 2]>,
}

/// A model's image processor.
#[derive(Debug, Clone, PartialEq)]
pub enum Processor {
    /// Gemma 3, CLIP (LLaVA), SigLIP.
    Basic(BasicImageProcessor),
    /// Qwen2-VL, Qwen2.5-VL, Qwen3-VL.
    QwenVl(QwenVlImageProcessor),
    /// Idefics3, SmolVLM.
    Idefics3(Idefics3ImageProcessor),
    /// Mistral 3 (Pixtral).
    Pixtral(PixtralImageProcessor),
}

impl Processor {
    /// The processor mlx-vlm builds for a model directory with config.json's `model_type`:
    /// `gemma3`; `qwen2_vl`, `qwen2_5_vl` (patch 14 by default), `qwen3_vl` (16); `idefics3`,
    /// `smolvlm`; `mistral3` (Pixtral); `llava` (CLIP or SigLIP by `image_processor_type`).
    /// Others are refused.
    pub fn from_model_dir(dir: &Path, model_type: &str) -> Result<Self> {
        match model_type {
            "qwen2_vl" | "qwen2_5_vl" => {
                Ok(Self::QwenVl(QwenVlImageProcessor::from_model_dir(dir, 14)?))
            }
            "qwen3_vl" | "qwen3_vl_moe" => {
                Ok(Self::QwenVl(QwenVlImageProcessor::from_model_dir(dir, 16)?))
            }
            "mistral3" => Ok(Self::Pixtral(PixtralImageProcessor::from_model_dir(dir)?)),
            _ => Self::from_hf_config(&hf::hf_config(dir)?, model_type),
        }
    }

    /// For the transformers-backed families, from the settings of [`hf::hf_config`].
    pub fn from_hf_config(
        config: &serde_json::Map<String, serde_json::Value>,
        model_type: &str,
    ) -> Result<Self> {
        let class = config
            .get("image_processor_type")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .trim_end_matches("Fast")
            .trim_end_matches("Pil");
        match (model_type, class) {
            ("gemma3", _) => Ok(Self::Basic(BasicImageProcessor::from_config(BasicKind::Gemma3, config)?)),
            ("idefics3" | "smolvlm", _) => {
                Ok(Self::Idefics3(Idefics3ImageProcessor::from_config(config)?))
            }
            (_, "CLIPImageProcessor") => Ok(Self::Basic(BasicImageProcessor::from_config(BasicKind::Clip, config)?)),
            (_, "SiglipImageProcessor") => Ok(Self::Basic(BasicImageProcessor::from_config(BasicKind::Siglip, config)?)),
            _ => Err(ImageError::Unsupported {
                field: "image_processor_type".into(),
                reason: format!(
                    "no image processor for model_type {model_type:?} with {class:?}: supported are \
                     gemma3, qwen2_vl, qwen2_5_vl, qwen3_vl, idefics3, smolvlm, and CLIP or SigLIP \
                     processors (llava)"
                ),
            }),
        }
    }

    /// The pixel tensors of these images (one prompt's images, in order).
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        match self {
            Self::Basic(p) => p.preprocess(images),
            Self::QwenVl(p) => p.preprocess(images),
            Self::Idefics3(p) => p.preprocess(images),
            Self::Pixtral(p) => p.preprocess(images),
        }
    }
}
