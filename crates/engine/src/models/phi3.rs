//! Phi-3 / Phi-3.5 / Phi-4-mini: one fused `qkv_proj` and one fused `gate_up_proj` per layer,
//! `head_dim = hidden / heads`, RoPE over `partial_rotary_factor` of each head, and Phi-3's own
//! RoPE scaling: `su` / `longrope` (long factors and an attention factor) or `linear`.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::rope::{rope_from_config, su_scaled},
    layers::weights::Weights,
    layers::Rope,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder, LayerSpec},
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
    #[serde(default = "default_partial_rotary_factor")]
    partial_rotary_factor: f64,
    #[serde(default = "default_max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "default_original_max_position_embeddings")]
    original_max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_partial_rotary_factor() -> f64 {
    1.0
}
fn default_max_position_embeddings() -> usize {
    131072
}
fn default_original_max_position_embeddings() -> usize {
    4096
}

fn unsupported(detail: String) -> EngineError {
    EngineError::load(LoadErrorKind::UnsupportedArchitecture, detail)
}

/// Phi-3's RoPE choice (mlx-lm's phi3.py, not the generic `initialize_rope`).
fn rope(args: &Args, dims: i32) -> Result<Rope, EngineError> {
    let Some(scaling) = args.common.rope_scaling.as_ref().filter(|s| !s.is_null()) else {
        return rope_from_config(dims, args.rope_theta, args.rope_traditional, None, None);
    };
    let rope_type = scaling.get("type").and_then(Value::as_str).unwrap_or("");
    match rope_type {
        "su" | "longrope" => {
            let long_factor: Vec<f32> = scaling
                .get("long_factor")
                .and_then(|f| serde_json::from_value(f.clone()).ok())
                .ok_or_else(|| {
                    EngineError::load(
                        LoadErrorKind::InvalidWeights,
                        format!("config.json: rope_scaling type `{rope_type}` needs a `long_factor` list"),
                    )
                })?;
            su_scaled(
                dims,
                args.rope_theta,
                args.max_position_embeddings,
                args.original_max_position_embeddings,
                &long_factor,
                scaling.get("long_mscale").and_then(Value::as_f64),
            )
        }
        "linear" => rope_from_config(
            dims,
            args.rope_theta,
            args.rope_traditional,
            Some(scaling),
            None,
        ),
        // mlx-lm falls back to unscaled RoPE here with a warning, which silently changes the
        // model; refusing says so instead.
        other => Err(unsupported(format!(
            "phi3: rope_scaling type `{other}` is not supported (su, longrope, linear, or none are)"
        ))),
    }
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = c.default_head_dim();
    let rope_dims = (head_dim as f64 * args.partial_rotary_factor) as i32;
    let layer = LayerSpec {
        fused: true,
        ..c.llama_layer(head_dim, rope(&args, rope_dims)?)
    };
    let max_pos = Some(args.max_position_embeddings);
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
