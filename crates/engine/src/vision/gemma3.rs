//! Gemma 3 with images (`Gemma3ForConditionalGeneration`), as mlx-vlm 0.7.0's `gemma3` computes
//! it: a SigLIP tower, then the projector (average pool of the patch grid down to
//! `mm_tokens_per_image` tokens, a Gemma RMS norm, a matrix into the language model's width);
//! the prompt's `<start_of_image>` becomes `\n\n<start_of_image>` + one `<image_soft_token>` per
//! image token + `<end_of_image>\n\n` (the processor's expansion, on text); the features replace
//! the soft tokens' embeddings. The language model is `models/gemma3_text.rs`.
//!
//! Where mlx-vlm differs from transformers, this follows mlx-vlm (docs/decisions/vision.md):
//! - features are divided by `sqrt(config.hidden_size)` (top-level, 2048 when absent) before the
//!   language model scales every embedding by `sqrt(text hidden)` rounded to bfloat16;
//! - with an image in the prompt, the embeddings of pad tokens are zeros;
//! - attention over image tokens is causal like every other token's;
//! - global layers' RoPE base is `rope_global_base_freq` (default 1e6): `rope_theta` is ignored;
//! - the tower's final LayerNorm uses eps 1e-5 (see `siglip.rs`);
//! - the output head is always the embedding table.

use mlx_rs::{ops, Array, Dtype};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, scalar_like, RmsNorm},
    models::parse_args,
    vision::{
        model::PromptTokens,
        model::VisionModel,
        shared::ImageInputs,
        siglip::{SiglipConfig, SiglipTower},
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    text_config: Value,
    vision_config: SiglipConfig,
    /// mlx-vlm's `ModelConfig.hidden_size`: the features' divisor (see the module docs).
    #[serde(default = "default_hidden_size")]
    hidden_size: i32,
    #[serde(default)]
    pad_token_id: Option<u32>,
    #[serde(default = "default_image_token_index")]
    image_token_index: u32,
}

fn default_hidden_size() -> i32 {
    2048
}
fn default_image_token_index() -> u32 {
    262_144
}

/// mlx-vlm's `TextConfig` defaults for what a Gemma 3 `text_config` may leave out, where they
/// differ from mlx-lm's `gemma3_text` (whose defaults `models/gemma3_text.rs` has).
fn text_config(mut text: Value) -> Value {
    let defaults = json!({
        "num_attention_heads": 8,
        "head_dim": 256,
        "rms_norm_eps": 1.0e-6,
        "vocab_size": 262208,
        "num_key_value_heads": 4,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 1024,
        "mm_tokens_per_image": 256,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 4096,
    });
    let obj = text.as_object_mut().expect("checked to be an object");
    for (k, v) in defaults.as_object().expect("an object") {
        obj.entry(k.clone()).or_insert_with(|| v.clone());
    }
    // mlx-vlm builds global layers' RoPE from `rope_global_base_freq`, never `rope_theta`.
    let base = obj
        .get("rope_global_base_freq")
        .cloned()
        .unwrap_or(json!(1_000_000.0));
    obj.insert("rope_theta".into(), base);
    obj.insert("model_type".into(), json!("gemma3_text"));
    text
}

/// The text tokens of the processor's expansion.
const BOI: &str = "<start_of_image>";
const EOI: &str = "<end_of_image>";
const IMAGE: &str = "<image_soft_token>";

pub struct Gemma3Vision {
    tower: SiglipTower,
    /// `1 + w` of `mm_soft_emb_norm`.
    soft_emb_norm: RmsNorm,
    /// `(vision hidden, text hidden)`.
    projection: Array,
    patches_per_side: i32,
    tokens_per_side: i32,
    tokens_per_image: usize,
    feature_divisor: f32,
    image_token_id: u32,
    pad_token_id: u32,
    /// The Hugging Face image processor mlx-vlm uses (`Gemma3ImageProcessor`).
    processor: images::processors::Processor,
}

/// Splits a Gemma 3 checkpoint: the vision side built here, the language model's tensors left
/// in `weights` under the names `models/gemma3_text.rs` reads; returns that model's config.
pub fn load(
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(Gemma3Vision, Value), EngineError> {
    let args: Args = parse_args(config)?;
    if !args.text_config.is_object() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: `text_config` must be an object",
        ));
    }
    let text = text_config(args.text_config);
    let (mut tower_weights, mut projector) = super::shared::split_parts(weights, "Gemma 3")?;
    for suffix in ["weight", "scales", "biases"] {
        weights.remove(&format!("lm_head.{suffix}"));
    }

    let vision = &args.vision_config;
    let tower = SiglipTower::load(vision, &mut tower_weights)?;
    let norm = projector.take("mm_soft_emb_norm.weight")?;
    let soft_emb_norm = RmsNorm {
        weight: scalar_like(1.0, &norm)?.add(&norm)?,
        eps: vision.layer_norm_eps,
    };
    let projection = projector.take("mm_input_projection_weight")?;
    for (part, rest) in [("vision tower", &tower_weights), ("projector", &projector)] {
        if let Some(name) = rest.names().next() {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!("unexpected tensor `{name}` in the {part}"),
            ));
        }
    }
    let tokens_per_image = text["mm_tokens_per_image"].as_u64().unwrap_or(256) as i32;
    let tokens_per_side = (tokens_per_image as f64).sqrt() as i32;
    let patches_per_side = vision.patches_per_side();
    if tokens_per_side == 0 || patches_per_side % tokens_per_side != 0 {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "mm_tokens_per_image {tokens_per_image} does not pool a {patches_per_side}x\
                 {patches_per_side} patch grid"
            ),
        ));
    }
    Ok((
        Gemma3Vision {
            tower,
            soft_emb_norm,
            projection,
            patches_per_side,
            tokens_per_side,
            tokens_per_image: (tokens_per_side * tokens_per_side) as usize,
            feature_divisor: (args.hidden_size as f64).sqrt() as f32,
            image_token_id: args.image_token_index,
            pad_token_id: args.pad_token_id.unwrap_or(0),
            processor,
        },
        text,
    ))
}

impl Gemma3Vision {
    /// mlx-vlm's `Gemma3MultiModalProjector`: `(B, patches, d)` -> `(B, tokens, text hidden)`.
    fn project(&self, x: &Array) -> layers::Result<Array> {
        let (b, d) = (x.dim(0), x.dim(2));
        let (p, t) = (self.patches_per_side, self.tokens_per_side);
        let k = p / t;
        let grid = x
            .transpose_axes(&[0, 2, 1])?
            .reshape(&[b, d, p, p])?
            .transpose_axes(&[0, 2, 3, 1])?;
        // `nn.AvgPool2d(k, k)` over a grid it divides: MLX's non-overlapping windows.
        let pooled = grid
            .reshape(&[b, t, k, t, k, d])?
            .transpose_axes(&[0, 1, 3, 2, 4, 5])?
            .mean_axes(&[3, 4], None)?;
        let tokens = pooled
            .transpose_axes(&[0, 3, 1, 2])?
            .reshape(&[b, d, t * t])?
            .transpose_axes(&[0, 2, 1])?;
        let normed = self.soft_emb_norm.forward(&tokens)?;
        normed.matmul(&self.projection)?.as_dtype(x.dtype())
    }
}

impl VisionModel for Gemma3Vision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        let images = images.len();
        super::shared::check_placeholders(text, BOI, images)?;
        let full = format!("\n\n{BOI}{}{EOI}\n\n", IMAGE.repeat(self.tokens_per_image));
        Ok(PromptTokens {
            text: text.replace(BOI, &full),
            tokens_per_image: vec![self.tokens_per_image; images],
        })
    }

    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError> {
        super::shared::pixel_values(&self.processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, dtype: Dtype) -> layers::Result<Array> {
        let pixels = inputs
            .pixel_values
            .transpose_axes(&[0, 2, 3, 1])?
            .as_dtype(dtype)?;
        let hidden = self.tower.forward(&pixels)?;
        let features = self.project(&hidden)?;
        let d = features.dim(-1);
        features.reshape(&[-1, d])
    }

    fn merge(&self, ids: &[u32], embeds: Array, features: &Array) -> layers::Result<Array> {
        // mlx-vlm: text rows kept, pad rows zero, image rows the features scaled down.
        let divisor = scalar_like(self.feature_divisor, features)?;
        let scaled = features.divide(&divisor)?.as_dtype(embeds.dtype())?;
        let pad = self.pad_token_id;
        let keep: Vec<bool> = ids.iter().map(|&id| id != pad).collect();
        let keep = Array::from_slice(&keep, &[1, ids.len() as i32, 1]);
        let zeros = ops::zeros_like(&embeds)?;
        let text = ops::select(&keep, &embeds, &zeros)?;
        super::shared::scatter_rows(ids, self.image_token_id, text, &scaled)
    }
}
