//! LLaVA (`LlavaForConditionalGeneration`), as mlx-vlm 0.7.0's `llava` computes it: a CLIP or
//! SigLIP tower (`clip.rs`, mlx-vlm's llava tower for both), the hidden state of
//! `vision_feature_layer` (default -2, the second to last layer's output; a list concatenates
//! several), the first position dropped with `vision_feature_select_strategy` "default" (CLIP's
//! class token; mlx-vlm drops it for a SigLIP tower too), then the projector
//! (`linear_1`, exact GELU, `linear_2`). The processor's expansion, on text: each `<image>`
//! becomes one `<image>` per feature; the features, cast to the embedding dtype, replace those
//! tokens' embeddings, unscaled. The language model is `models/llama.rs` or `models/qwen2.rs`
//! with mlx-vlm's llava `TextConfig` (see [`text_config`]).

use std::path::Path;

use mlx_rs::{
    ops::{self, indexing::TryIndexOp},
    Array, Dtype,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, gelu, Linear},
    models::parse_args,
    vision::{
        clip::{ClipConfig, ClipTower},
        model::PromptTokens,
        model::VisionModel,
        shared::ImageInputs,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    text_config: Value,
    vision_config: ClipConfig,
    #[serde(default = "default_image_token_index")]
    image_token_index: u32,
    #[serde(default = "default_strategy")]
    vision_feature_select_strategy: String,
    #[serde(default = "default_feature_layer")]
    vision_feature_layer: Value,
}

fn default_image_token_index() -> u32 {
    32000
}
fn default_strategy() -> String {
    "default".into()
}
fn default_feature_layer() -> Value {
    json!(-2)
}

/// The settings of `processor_config.json` mlx-vlm's `LlavaProcessor` reads for the expansion.
#[derive(Debug, Default, Deserialize)]
struct ProcessorArgs {
    patch_size: Option<i32>,
    vision_feature_select_strategy: Option<String>,
    #[serde(default)]
    num_additional_image_tokens: i32,
    image_token: Option<String>,
}

/// mlx-vlm's llava `TextConfig`: its defaults for what `text_config` leaves out (they differ
/// from mlx-lm's: the head is untied and RoPE's base is 1e4 for Qwen2 too), and what it does
/// not read removed (`head_dim` is always `hidden / heads`; no sliding windows).
fn text_config(mut text: Value) -> Result<Value, EngineError> {
    let defaults = json!({
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": 32000,
        "rope_theta": 10000.0,
        "rope_traditional": false,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
    });
    let obj = text.as_object_mut().expect("checked to be an object");
    for (k, v) in defaults.as_object().expect("an object") {
        if obj.get(k).is_none_or(Value::is_null) {
            obj.insert(k.clone(), v.clone());
        }
    }
    if obj.get("num_key_value_heads").is_none_or(Value::is_null) {
        let heads = obj["num_attention_heads"].clone();
        obj.insert("num_key_value_heads".into(), heads);
    }
    for key in ["head_dim", "layer_types", "sliding_window"] {
        obj.remove(key);
    }
    let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
    if !matches!(model_type, "llama" | "qwen2") {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "LLaVA language model `{model_type}` is not supported; supported: llama, qwen2"
            ),
        ));
    }
    Ok(text)
}

pub struct LlavaVision {
    tower: ClipTower,
    /// Hidden-state indices (into embeddings + every layer) whose features are concatenated.
    feature_layers: Vec<usize>,
    /// Drop each selected hidden state's first position ("default" strategy).
    drop_first: bool,
    linear_1: Linear,
    linear_2: Linear,
    image_token: String,
    image_token_id: u32,
    tokens_per_image: usize,
    /// The Hugging Face image processor mlx-vlm uses (CLIP or SigLIP).
    processor: images::processors::Processor,
}

/// Splits a LLaVA checkpoint: the vision side built here, the language model's tensors left
/// in `weights` under mlx-lm's names; returns that model's config.
pub fn load(
    dir: &Path,
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(LlavaVision, Value), EngineError> {
    let args: Args = parse_args(config)?;
    if !args.text_config.is_object() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: `text_config` must be an object",
        ));
    }
    let text = text_config(args.text_config)?;
    let vision = &args.vision_config;
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);

    // Hidden states: index 0 the embeddings, i the output of layer i; negative from the end.
    let states = vision.num_hidden_layers as i64 + 1;
    let layers: Vec<i64> = match &args.vision_feature_layer {
        Value::Number(n) => n.as_i64().into_iter().collect(),
        Value::Array(list) => list.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    };
    let feature_layers = layers
        .iter()
        .map(|&l| {
            let i = if l < 0 { states + l } else { l };
            match (0..states).contains(&i) {
                true => Ok(i as usize),
                false => Err(invalid(format!(
                    "config.json: vision_feature_layer {l} is outside the tower's {states} \
                     hidden states"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if feature_layers.is_empty() {
        return Err(invalid(format!(
            "config.json: vision_feature_layer must be an integer or a list of integers, not {}",
            args.vision_feature_layer
        )));
    }
    let drop_first = args.vision_feature_select_strategy == "default";

    let (mut tower_weights, mut projector) = super::shared::split_parts(weights, "LLaVA")?;

    let deepest = feature_layers.iter().copied().max().unwrap_or(0);
    let tower = ClipTower::load(vision, &mut tower_weights, deepest)?;
    let linear_1 = projector.linear("linear_1")?;
    let linear_2 = projector.linear("linear_2")?;
    for (part, rest) in [("vision tower", &tower_weights), ("projector", &projector)] {
        if let Some(name) = rest.names().next() {
            return Err(invalid(format!("unexpected tensor `{name}` in the {part}")));
        }
    }

    // mlx-vlm's `LlavaProcessor`: (side / patch)^2 + num_additional_image_tokens, one less with
    // the "default" strategy. The side is the tower's: the processor must make images of it.
    let path = dir.join("processor_config.json");
    let proc: ProcessorArgs = super::shared::processor_args(dir)?;
    let patch = proc.patch_size.unwrap_or(vision.patch_size).max(1);
    let side = vision.image_size / patch;
    let mut tokens = side * side + proc.num_additional_image_tokens;
    if proc.vision_feature_select_strategy.as_deref() == Some("default") {
        tokens -= 1;
    }
    let features = vision.positions() - i32::from(drop_first);
    if tokens != features {
        return Err(invalid(format!(
            "{} expands each image to {tokens} tokens, but the model makes {features} features \
             per image (config.json: {}x{} px, patch {}, vision_feature_select_strategy {:?})",
            path.display(),
            vision.image_size,
            vision.image_size,
            vision.patch_size,
            args.vision_feature_select_strategy
        )));
    }
    Ok((
        LlavaVision {
            tower,
            feature_layers,
            drop_first,
            linear_1,
            linear_2,
            image_token: proc.image_token.unwrap_or_else(|| "<image>".into()),
            image_token_id: args.image_token_index,
            tokens_per_image: tokens as usize,
            processor,
        },
        text,
    ))
}

impl VisionModel for LlavaVision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        let images = images.len();
        if images == 0 {
            // mlx-vlm expands only with pixel values.
            return Ok(PromptTokens {
                text: text.to_owned(),
                tokens_per_image: Vec::new(),
            });
        }
        let token = &self.image_token;
        super::shared::check_placeholders(text, token, images)?;
        Ok(PromptTokens {
            text: text.replace(token.as_str(), &token.repeat(self.tokens_per_image)),
            tokens_per_image: vec![self.tokens_per_image; images],
        })
    }

    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError> {
        super::shared::pixel_values(&self.processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, _dtype: Dtype) -> layers::Result<Array> {
        // mlx-vlm's llava gives the tower float32 pixels as they are (no cast).
        let pixels = inputs.pixel_values.transpose_axes(&[0, 2, 3, 1])?;
        let states = self.tower.hidden_states(&pixels, &self.feature_layers)?;
        let states = states
            .into_iter()
            .map(|s| match self.drop_first {
                true => s.try_index((.., 1..)),
                false => Ok(s),
            })
            .collect::<layers::Result<Vec<_>>>()?;
        let selected = match states.len() {
            1 => states.into_iter().next().expect("one"),
            _ => ops::concatenate(&states, -1)?,
        };
        let features = self
            .linear_2
            .forward(&gelu(&self.linear_1.forward(&selected)?)?)?;
        let d = features.dim(-1);
        features.reshape(&[-1, d])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_config_gets_mlx_vlm_defaults() {
        let text = text_config(json!({
            "model_type": "qwen2",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "head_dim": 32,
            "sliding_window": 4096,
            "rope_theta": null,
        }))
        .unwrap();
        assert_eq!(text["tie_word_embeddings"], json!(false));
        assert_eq!(text["rope_theta"], json!(10000.0));
        assert_eq!(text["num_key_value_heads"], json!(4));
        assert_eq!(text["hidden_size"], json!(64));
        assert!(text.get("head_dim").is_none() && text.get("sliding_window").is_none());
    }

    #[test]
    fn other_language_models_are_refused_by_name() {
        match text_config(json!({"model_type": "mistral"})) {
            Err(EngineError::Load { kind, detail }) => {
                assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
                assert!(detail.contains("`mistral`"), "{detail}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
