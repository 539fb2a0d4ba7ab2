//! Qwen2 / Qwen2.5: the Llama layout with biases on the q/k/v projections (picked up from the
//! checkpoint's `*.bias` tensors), `head_dim = hidden / heads` whatever config.json says, and
//! RoPE base 1e6 by default.
//!
//! `use_sliding_window` / `sliding_window` are ignored, as mlx-lm ignores them: every layer
//! attends to the whole context.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder},
        model::parse_args,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default = "default_max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    1_000_000.0
}
fn default_max_position_embeddings() -> usize {
    32768
}
fn default_true() -> bool {
    true
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = c.default_head_dim();
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(head_dim, args.rope_theta, args.rope_traditional, max_pos)?;
    let layer = c.llama_layer(head_dim, rope);
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
