//! Vision-language models: an image encoder (vision tower and projector) whose features take
//! the place of the prompt's image tokens, in front of a language model from `models/`.
//!
//! A family file (`gemma3.rs`, `llava.rs`, `qwen_vl.rs`, `idefics3.rs`) splits its checkpoint
//! into the vision side, built there, and the language model's tensors and config, which
//! `models::build` turns into the decoder. Towers live beside it (`siglip.rs`, `clip.rs`,
//! `qwen2_5_vit.rs` and `qwen3_vit.rs` with what they share in `qwen_vit.rs`). What a family does to the
//! prompt (its processor's text-level expansion of image placeholders) lives in its file too.

mod clip;
mod gemma3;
mod idefics3;
mod llava;
mod mistral3;
mod model;
mod pixtral;
mod qwen2_5_vit;
mod qwen3_vit;
mod qwen_vit;
mod qwen_vl;
pub(crate) mod shared;
mod siglip;

use std::path::Path;

use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    models,
};

pub use model::VisionModel;

/// The vision `model_type`s this build runs, as `capabilities.architectures` lists them.
pub const ARCHITECTURES: &[&str] = &[
    "gemma3",
    "llava",
    "mistral3",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "idefics3",
    "smolvlm",
];

/// Builds the vision side of a vision-language checkpoint and leaves its language model's
/// tensors in `weights`, returning the config `models::build` takes for it. A text model
/// comes back as it is, with no vision side.
pub(crate) fn split(
    dir: &Path,
    config: &Value,
    weights: &mut Weights,
) -> Result<(Option<Box<dyn VisionModel>>, Value), EngineError> {
    let model_type = config["model_type"].as_str().unwrap_or_default();
    match model_type {
        "gemma3" => {
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) = gemma3::load(config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "llava" => {
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) = llava::load(dir, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "qwen2_vl" | "qwen2_5_vl" | "qwen3_vl" => {
            let family = match model_type {
                "qwen2_vl" => qwen_vl::Family::Qwen2,
                "qwen2_5_vl" => qwen_vl::Family::Qwen25,
                _ => qwen_vl::Family::Qwen3,
            };
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) = qwen_vl::load(family, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        // Qwen3-VL-MoE with its tower (mlx-vlm's conversions, Hugging Face's releases); a
        // checkpoint without one (mlx-lm's conversions keep `vision_config` but drop the tower)
        // runs as text, as mlx-lm runs it.
        "qwen3_vl_moe" if holds_patch_embedding(weights) => {
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) =
                qwen_vl::load(qwen_vl::Family::Qwen3Moe, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        // Mistral Small 4 (a `mistral4` language model) runs as text, as mlx-lm runs it:
        // mlx-vlm 0.7's Mistral 4 computes otherwise than mlx-lm's (it expands the latent
        // keys, routes without groups, scales without YaRN's mscale), so its images have no
        // reference the worker could be exact against.
        "mistral3"
            if config.get("vision_config").is_some_and(|v| !v.is_null())
                && config.pointer("/text_config/model_type") != Some(&Value::from("mistral4")) =>
        {
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) = mistral3::load(dir, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "idefics3" | "smolvlm" => {
            let family = match model_type {
                "idefics3" => idefics3::Family::Idefics3,
                _ => idefics3::Family::SmolVlm,
            };
            let processor = shared::image_processor(dir, model_type)?;
            let (vision, text) = idefics3::load(family, dir, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        // Their language model alone, as mlx-lm runs them (`models::build` takes it out).
        m if models::TEXT_OF_MULTIMODAL.contains(&m) => Ok((None, config.clone())),
        _ if config.get("vision_config").is_some_and(|v| !v.is_null()) => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "vision model_type `{model_type}` is not supported; supported vision \
                     families: {}",
                ARCHITECTURES.join(", ")
            ),
        )),
        _ => Ok((None, config.clone())),
    }
}

/// Whether a Qwen-VL checkpoint holds its vision tower's patch embedding, under any of the
/// names `qwen_vl.rs` reads.
fn holds_patch_embedding(weights: &Weights) -> bool {
    let towers = ["vision_tower.", "model.visual.", "visual."];
    (weights.names()).any(|n| {
        towers
            .iter()
            .any(|t| n.starts_with(&format!("{t}patch_embed.")))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use mlx_rs::Array;

    use super::*;

    #[test]
    fn an_unknown_vision_family_is_unsupported_and_named() {
        let config = json!({"model_type": "kimi_vl", "vision_config": {"depth": 2}});
        let mut weights = Weights::from_tensors(Default::default(), &config);
        match split(Path::new("."), &config, &mut weights) {
            Err(EngineError::Load { kind, detail }) => {
                assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
                assert!(detail.contains("`kimi_vl`"), "{detail}");
                assert!(
                    detail.contains("gemma3"),
                    "lists what is supported: {detail}"
                );
            }
            Err(other) => panic!("expected a load error, got {other:?}"),
            Ok(_) => panic!("expected a load error, got a model"),
        }
    }

    #[test]
    fn a_text_model_has_no_vision_side() {
        let config = json!({"model_type": "llama", "vision_config": null});
        let mut weights = Weights::from_tensors(Default::default(), &config);
        let (vision, text) = split(Path::new("."), &config, &mut weights).unwrap();
        assert!(vision.is_none());
        assert_eq!(text, config);
    }

    #[test]
    fn features_take_the_image_tokens_rows_in_order() {
        let embeds = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[1, 4, 1]);
        let features = Array::from_slice(&[10.0f32, 20.0], &[2, 1]);
        let merged = shared::scatter_rows(&[5, 9, 5, 9], 9, embeds, &features).unwrap();
        assert_eq!(merged.as_slice::<f32>(), [0.0, 10.0, 2.0, 20.0]);
        let too_few = Array::from_slice(&[10.0f32], &[1, 1]);
        let embeds = Array::from_slice(&[0.0f32, 1.0], &[1, 2, 1]);
        assert!(shared::scatter_rows(&[9, 9], 9, embeds, &too_few).is_err());
    }
}
