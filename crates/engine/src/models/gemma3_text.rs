//! Gemma 3 (text): four norms per block (a norm on each sublayer's output too), norms applied
//! as `1 + w`, GeGLU MLP (tanh GELU), embeddings scaled by `sqrt(hidden)` rounded to bfloat16,
//! q/k norms, scores scaled by `query_pre_attn_scalar^-0.5`, and layers that alternate between
//! sliding-window attention (local RoPE base) and global attention (`rope_theta`, scaling).
//! Layer `i` is global when `(i + 1) % sliding_window_pattern == 0`, as in mlx-lm.
//!
//! Sliding-window layers get a rotating cache of `sliding_window` positions (as in mlx-lm), so
//! memory for those layers stays bounded however long the context grows.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    models::{
        parse_args,
        transformer::{sanitize, CommonArgs, Decoder, DecoderSpec, LayerSpec, NormLayout},
    },
    nn::{Activation, AttentionShape},
    rope::rope_from_config,
    weights::Weights,
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    #[serde(default = "default_head_dim")]
    head_dim: i32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default = "default_rope_local_base_freq")]
    rope_local_base_freq: f32,
    #[serde(default = "default_query_pre_attn_scalar")]
    query_pre_attn_scalar: f64,
    #[serde(default = "default_sliding_window")]
    sliding_window: i32,
    #[serde(default = "default_sliding_window_pattern")]
    sliding_window_pattern: usize,
    #[serde(default = "default_max_position_embeddings")]
    max_position_embeddings: usize,
}

fn default_head_dim() -> i32 {
    256
}
fn default_rope_theta() -> f32 {
    1_000_000.0
}
fn default_rope_local_base_freq() -> f32 {
    10_000.0
}
fn default_query_pre_attn_scalar() -> f64 {
    256.0
}
fn default_sliding_window() -> i32 {
    512
}
fn default_sliding_window_pattern() -> usize {
    6
}
fn default_max_position_embeddings() -> usize {
    32768
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    // mlx-lm's Gemma 3 ties the head exactly when the checkpoint has none.
    let tie_word_embeddings = !weights.names().any(|n| n == "lm_head.weight");
    sanitize(&mut weights, tie_word_embeddings);
    let pattern = args.sliding_window_pattern.max(1);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for i in 0..c.num_hidden_layers {
        let sliding = (i + 1) % pattern != 0;
        // Local layers take no rope_scaling (mlx-lm builds their RoPE without it).
        let rope = match sliding {
            true => rope_from_config(args.head_dim, args.rope_local_base_freq, false, None, None)?,
            false => c.rope(
                args.head_dim,
                args.rope_theta,
                false,
                Some(args.max_position_embeddings),
            )?,
        };
        let shape = AttentionShape {
            window: sliding.then_some(args.sliding_window),
            ..AttentionShape::new(
                c.num_attention_heads,
                c.num_key_value_heads.unwrap_or(1),
                args.head_dim,
                args.query_pre_attn_scalar,
            )
        };
        layers.push(LayerSpec {
            qk_norm: true,
            norms: NormLayout::Sandwich,
            activation: Activation::GeluApprox,
            norm_plus_one: true,
            ..LayerSpec::llama(c.rms_norm_eps, shape, rope)
        });
    }
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        norm_plus_one: true,
        tie_word_embeddings,
        embed_scale: Some((c.hidden_size as f64).sqrt() as f32),
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    Decoder::load(weights, spec)
}
