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
mod pixtral;
mod qwen2_5_vit;
mod qwen3_vit;
mod qwen_vit;
mod qwen_vl;
mod siglip;

use std::path::Path;

use mlx_rs::{ops, Array, Dtype};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    models, nn,
    rope::MropePositions,
    weights::Weights,
};

/// The vision `model_type`s this build runs, as `capabilities.architectures` lists them.
pub const ARCHITECTURES: &[&str] = &[
    "gemma3",
    "llava",
    "mistral3",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "idefics3",
    "smolvlm",
];

/// A batch of images as the family's encoder takes them.
pub struct ImageInputs {
    /// `(images, channels, height, width)`, float32, as the Hugging Face processor makes it.
    pub pixel_values: Array,
    /// Qwen-VL: `[t, h, w]` in patches, per image.
    pub grid_thw: Vec<[usize; 3]>,
    /// Mistral 3: each image's `[height, width]` in pixels before the batch's padding.
    pub image_sizes: Vec<[usize; 2]>,
}

/// A rendered prompt with its image placeholders expanded.
pub struct PromptTokens {
    pub text: String,
    /// Image tokens per image, in prompt order.
    pub tokens_per_image: Vec<usize>,
}

/// The vision side of a vision-language model.
pub trait VisionModel {
    /// The token id whose embeddings image features replace.
    fn image_token_id(&self) -> u32;
    /// Expands the placeholders the chat template wrote for `images` (one each, in order) into
    /// the tokens the model expects (the processor's step, on text, so tokenization matches
    /// it; some families' counts depend on the image's size).
    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError>;
    /// The rotary positions of the whole prompt `ids` with `images`, for a family whose
    /// language model takes them explicitly (M-RoPE); `None`: positions are token indices.
    fn positions(
        &self,
        _ids: &[u32],
        _images: &[images::RgbImage],
    ) -> Result<Option<MropePositions>, EngineError> {
        Ok(None)
    }
    /// The images' pixel values, as the family's Hugging Face processor computes them.
    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError>;
    /// Feature rows `(image tokens, text hidden)` for `inputs`, computed in `dtype` (the
    /// language model's embedding dtype, as mlx-vlm casts the pixels).
    fn encode(&self, inputs: &ImageInputs, dtype: Dtype) -> nn::Result<Array>;
    /// [`VisionModel::encode`]'s features and, for Qwen3-VL (deepstack), per first language
    /// layer the rows `(image tokens, hidden)` added to that layer's output at the image
    /// tokens. Other families: none.
    fn encode_with_deepstack(
        &self,
        inputs: &ImageInputs,
        dtype: Dtype,
    ) -> nn::Result<(Array, Vec<Array>)> {
        Ok((self.encode(inputs, dtype)?, Vec::new()))
    }
    /// The language model's input embeddings `(1, L, hidden)` for `ids`, with `features` (one
    /// row per image token among `ids`, in order) in the image tokens' places. By default as
    /// mlx-vlm's LLaVA and Idefics3 do: the features cast to the embeddings' dtype, written over
    /// the image rows, unscaled.
    fn merge(&self, ids: &[u32], embeds: Array, features: &Array) -> nn::Result<Array> {
        let features = features.as_dtype(embeds.dtype())?;
        scatter_rows(ids, self.image_token_id(), embeds, &features)
    }
}

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
            let processor = image_processor(dir, model_type)?;
            let (vision, text) = gemma3::load(config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "llava" => {
            let processor = image_processor(dir, model_type)?;
            let (vision, text) = llava::load(dir, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "qwen2_vl" | "qwen2_5_vl" | "qwen3_vl" => {
            let family = match model_type {
                "qwen2_vl" => qwen_vl::Family::Qwen2,
                "qwen2_5_vl" => qwen_vl::Family::Qwen25,
                _ => qwen_vl::Family::Qwen3,
            };
            let processor = image_processor(dir, model_type)?;
            let (vision, text) = qwen_vl::load(family, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "mistral3" if config.get("vision_config").is_some_and(|v| !v.is_null()) => {
            let processor = image_processor(dir, model_type)?;
            let (vision, text) = mistral3::load(dir, config, weights, processor)?;
            Ok((Some(Box::new(vision)), text))
        }
        "idefics3" | "smolvlm" => {
            let family = match model_type {
                "idefics3" => idefics3::Family::Idefics3,
                _ => idefics3::Family::SmolVlm,
            };
            let processor = image_processor(dir, model_type)?;
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

/// Splits a `*ForConditionalGeneration` checkpoint: returns the vision tower's tensors (under
/// `vision_tower.vision_model.`) and the projector's (`multi_modal_projector.`), and leaves the
/// language model's in `weights`, under mlx-lm's names (`model.*`, `lm_head.*`). transformers 5
/// saves `model.language_model.*`, `model.vision_tower.*`, ...; mlx-vlm, mlx-community and
/// older Hugging Face checkpoints have the older names: both are read. A tensor of no part is an
/// error naming `family`.
fn split_parts(weights: &mut Weights, family: &str) -> Result<(Weights, Weights), EngineError> {
    weights.rename_prefix("model.language_model.", "language_model.model.");
    weights.rename_prefix("model.vision_tower.", "vision_tower.");
    weights.rename_prefix("model.multi_modal_projector.", "multi_modal_projector.");
    weights.rename_prefix("lm_head.", "language_model.lm_head.");
    let tower = weights.split_off("vision_tower.vision_model.");
    let projector = weights.split_off("multi_modal_projector.");
    let language = weights.split_off("language_model.");
    keep_language(weights, language, family)?;
    Ok((tower, projector))
}

/// Ends a family's split of its checkpoint: a tensor that went to no part is an error naming
/// `family`; otherwise `weights` becomes `language`, the language model's tensors.
fn keep_language(
    weights: &mut Weights,
    language: Weights,
    family: &str,
) -> Result<(), EngineError> {
    if let Some(name) = weights.names().next() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("tensor `{name}` belongs to no part of the {family} vision model"),
        ));
    }
    *weights = language;
    Ok(())
}

/// The model's Hugging Face image processor, from its processor files.
fn image_processor(
    dir: &Path,
    model_type: &str,
) -> Result<images::processors::Processor, EngineError> {
    images::processors::Processor::from_model_dir(dir, model_type).map_err(|e| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("image processor of {}: {e}", dir.display()),
        )
    })
}

/// Checks that the rendered `text` has one `placeholder` per image, as the chat template writes
/// them; a count that differs (a placeholder typed in the text) is the request's error.
fn check_placeholders(text: &str, placeholder: &str, images: usize) -> Result<(), EngineError> {
    let found = text.matches(placeholder).count();
    match found == images {
        true => Ok(()),
        false => Err(EngineError::InvalidParams {
            field: "messages".into(),
            reason: format!(
                "the prompt has {found} `{placeholder}` placeholders for {images} images (the \
                 chat template writes one per image part; do not write `{placeholder}` in text)"
            ),
        }),
    }
}

/// The settings a family reads from `processor_config.json` (the defaults when there is none).
fn processor_args<T: serde::de::DeserializeOwned + Default>(dir: &Path) -> Result<T, EngineError> {
    let path = dir.join("processor_config.json");
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    match images::processors::hf::read_json(&path) {
        Ok(Some(v)) => {
            serde_json::from_value(v).map_err(|e| invalid(format!("{}: {e}", path.display())))
        }
        Ok(None) => Ok(T::default()),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// The pixel values `processor` makes of `images`, as an MLX array.
fn pixel_values(
    processor: &images::processors::Processor,
    images: &[images::RgbImage],
) -> Result<ImageInputs, EngineError> {
    let processed = processor
        .preprocess(images)
        .map_err(|e| EngineError::InvalidParams {
            field: "messages".into(),
            reason: format!("preprocessing the images: {e}"),
        })?;
    let p = processed.pixel_values;
    let shape: Vec<i32> = p.shape.iter().map(|&d| d as i32).collect();
    Ok(ImageInputs {
        pixel_values: Array::from_slice(&p.data, &shape),
        grid_thw: processed.image_grid_thw,
        image_sizes: processed.image_sizes,
    })
}

/// `embeds` `(1, L, D)` with the rows of `image_id` tokens replaced, in order, by the rows of
/// `features` `(F, D)` (mlx-vlm's `masked_scatter`), as a gather over both.
pub(crate) fn scatter_rows(
    ids: &[u32],
    image_id: u32,
    embeds: Array,
    features: &Array,
) -> nn::Result<Array> {
    let (l, d) = (ids.len() as i32, embeds.dim(-1));
    let mut next = l;
    let rows: Vec<i32> = (0..l)
        .map(|i| match ids[i as usize] == image_id {
            true => {
                next += 1;
                next - 1
            }
            false => i,
        })
        .collect();
    let found = next - l;
    if found != features.dim(0) {
        return Err(mlx_rs::error::Exception::custom(format!(
            "{found} image tokens for {} image feature rows",
            features.dim(0)
        )));
    }
    let table = ops::concatenate(&[embeds.reshape(&[l, d])?, features.clone()], 0)?;
    table
        .take_axis(Array::from_slice(&rows, &[l]), 0)?
        .reshape(&[1, l, d])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_unknown_vision_family_is_unsupported_and_named() {
        let config = json!({"model_type": "qwen3_vl_moe", "vision_config": {"depth": 2}});
        let mut weights = Weights::from_tensors(Default::default(), &config);
        match split(Path::new("."), &config, &mut weights) {
            Err(EngineError::Load { kind, detail }) => {
                assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
                assert!(detail.contains("`qwen3_vl_moe`"), "{detail}");
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
        let merged = scatter_rows(&[5, 9, 5, 9], 9, embeds, &features).unwrap();
        assert_eq!(merged.as_slice::<f32>(), [0.0, 10.0, 2.0, 20.0]);
        let too_few = Array::from_slice(&[10.0f32], &[1, 1]);
        let embeds = Array::from_slice(&[0.0f32, 1.0], &[1, 2, 1]);
        assert!(scatter_rows(&[9, 9], 9, embeds, &too_few).is_err());
    }
}
