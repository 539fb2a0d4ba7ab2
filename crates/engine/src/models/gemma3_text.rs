//! Gemma 3 (text): four norms per block (a norm on each sublayer's output too), norms applied
//! as `1 + w`, GeGLU MLP (tanh GELU), embeddings scaled by `sqrt(hidden)` rounded to bfloat16,
//! q/k norms, scores scaled by `query_pre_attn_scalar^-0.5`, and layers that alternate between
//! sliding-window attention (local RoPE base) and global attention (`rope_theta`, scaling).
//! Layer `i` is global when `(i + 1) % sliding_window_pattern == 0`, as in mlx-lm.
//!
//! Sliding-window layers get a rotating cache of `sliding_window` positions (as in mlx-lm), so
//! memory for those layers stays bounded however long the context grows.
//!
//! What mlx-lm's gemma3_text.py computes differently from Llama around the shared layers is
//! [`Gemma3`], the family's hooks into the shared decoder.

use mlx_rs::{ops, Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{self, scalar_like, Activation, AttentionShape, QkNormOver},
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, Family, LayerSpec, NormLayout},
        model::parse_args,
    },
};

/// Gemma 3's own computations, as mlx-lm's gemma3_text.py does them.
pub struct Gemma3 {
    hidden_size: i32,
}

impl Family for Gemma3 {
    /// Norms are stored as `w` and applied as `1 + w` (mlx-lm's Gemma `RMSNorm`: `1.0 + weight`,
    /// a Python float, so in the weight's dtype), computed here once instead of on every call.
    fn norm_weight(&self, stored: Array) -> layers::Result<Array> {
        scalar_like(1.0, &stored)?.add(&stored)
    }

    /// `h *= mx.array(hidden_size**0.5, mx.bfloat16).astype(h.dtype)`.
    fn scale_embeddings(&self, h: Array) -> layers::Result<Array> {
        let s = Array::from_f32((self.hidden_size as f64).sqrt() as f32)
            .as_dtype(Dtype::Bfloat16)?
            .as_dtype(h.dtype())?;
        h.multiply(&s)
    }

    /// `x + y`; in float16 summed in float32 and clipped to float16's range (mlx-lm's
    /// `clip_residual`), so that large activations do not overflow to inf.
    fn residual(&self, x: &Array, y: &Array) -> layers::Result<Array> {
        if x.dtype() != Dtype::Float16 {
            return x.add(y);
        }
        let bound = Array::from_f32(65504.0);
        let sum = x
            .as_dtype(Dtype::Float32)?
            .add(y.as_dtype(Dtype::Float32)?)?;
        ops::clip(&sum, (&bound.negative()?, &bound))?.as_dtype(Dtype::Float16)
    }
}

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

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<Gemma3>, EngineError> {
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
            qk_norm: Some(QkNormOver::Head),
            norms: NormLayout::Sandwich,
            activation: Activation::GeluApprox,
            ..LayerSpec::llama(c.rms_norm_eps, shape, rope)
        });
    }
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings,
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    let family = Gemma3 {
        hidden_size: c.hidden_size,
    };
    Decoder::load(weights, spec, family)
}
