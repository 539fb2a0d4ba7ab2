//! Qwen3 (dense): the Llama layout without q/k/v biases, an RMS norm over each query and key
//! head before RoPE, and `head_dim` taken from config.json.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder, LayerSpec},
        model::parse_args,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    max_position_embeddings: usize,
    tie_word_embeddings: bool,
    rope_theta: Option<f32>,
    /// transformers >= 5 nests `rope_theta` (and the scaling) here.
    rope_parameters: Option<Value>,
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let mut args: Args = parse_args(config)?;
    let nested = args.rope_parameters.take().filter(|p| p.is_object());
    if let Some(p) = &nested {
        args.rope_theta = args.rope_theta.or_else(|| {
            p.get("rope_theta")
                .and_then(Value::as_f64)
                .map(|t| t as f32)
        });
        args.common.rope_scaling = args.common.rope_scaling.take().or(nested.clone());
    }
    let rope_theta = args.rope_theta.ok_or_else(|| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: qwen3 needs `rope_theta` (or `rope_parameters.rope_theta`)",
        )
    })?;
    let c = &args.common;
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(args.head_dim, rope_theta, false, max_pos)?;
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Head),
        ..c.llama_layer(args.head_dim, rope)
    };
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
