//! OLMo 2: the Llama layers with the norms moved after the sublayers (each output is
//! normalised before its residual add, nothing before attention or the MLP), and RMS norms
//! over the whole query and key projections (all heads at once) before RoPE.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    models::{
        parse_args,
        transformer::{load_uniform, CommonArgs, Decoder, LayerSpec, NormLayout},
    },
    nn::QkNormOver,
    weights::Weights,
};

/// mlx-lm's `ModelArgs` defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: Option<i32>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_true() -> bool {
    true
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = args.max_position_embeddings;
    let rope = c.rope(head_dim, args.rope_theta, args.rope_traditional, max_pos)?;
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Projection),
        norms: NormLayout::PostNorm,
        ..c.llama_layer(head_dim, rope)
    };
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
