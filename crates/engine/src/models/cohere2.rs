//! Cohere 2 (Command R7B, Command A): layer norms (an offset only with `layer_norm_bias`),
//! attention and MLP side by side on one norm (`NormLayout::Parallel`), tied embeddings and
//! logits times `logit_scale`. Of every `sliding_window_pattern` layers the last is global
//! (no positional encoding, attends to everything); the others attend within `sliding_window`
//! with traditional RoPE. mlx-lm's cohere2.py runs attention in float32 for float16 weights;
//! here it runs in the weights' dtype (the released checkpoints are bfloat16).

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, scalar_like},
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, Family, LayerSpec, NormLayout},
        model::parse_args,
    },
};

/// mlx-lm's cohere2 `ModelArgs` and their defaults.
#[derive(Debug, Deserialize)]
struct Args {
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    #[serde(default = "default_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "default_head_dim")]
    head_dim: i32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
    #[serde(default = "default_logit_scale")]
    logit_scale: f32,
    #[serde(default = "default_window")]
    sliding_window: i32,
    #[serde(default = "default_pattern")]
    sliding_window_pattern: usize,
    rope_scaling: Option<Value>,
}

fn default_kv_heads() -> i32 {
    8
}
fn default_head_dim() -> i32 {
    128
}
fn default_rope_theta() -> f32 {
    50000.0
}
fn default_eps() -> f32 {
    1e-5
}
fn default_logit_scale() -> f32 {
    0.0625
}
fn default_window() -> i32 {
    4096
}
fn default_pattern() -> usize {
    4
}

/// Cohere's own computations around the shared layers.
pub struct Cohere2 {
    logit_scale: f32,
}

impl Family for Cohere2 {
    fn layer_norms(&self) -> bool {
        true
    }

    /// `logits * logit_scale` (a Python float: in the logits' dtype).
    fn logits(&self, logits: Array) -> layers::Result<Array> {
        logits.multiply(scalar_like(self.logit_scale, &logits)?)
    }
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<Cohere2>, EngineError> {
    let args: Args = parse_args(config)?;
    let invalid = |detail: String| Err(EngineError::load(LoadErrorKind::InvalidWeights, detail));
    if args.head_dim * args.num_attention_heads != args.hidden_size {
        return invalid(format!(
            "config.json: cohere2 needs head_dim x num_attention_heads = hidden_size (got {} x \
             {} and {})",
            args.head_dim, args.num_attention_heads, args.hidden_size
        ));
    }
    if args.sliding_window_pattern == 0 || args.sliding_window < 1 {
        return invalid(
            "config.json: cohere2 needs a positive sliding_window and \
                        sliding_window_pattern"
                .into(),
        );
    }
    let c = CommonArgs {
        hidden_size: args.hidden_size,
        num_hidden_layers: args.num_hidden_layers,
        num_attention_heads: args.num_attention_heads,
        num_key_value_heads: Some(args.num_key_value_heads),
        rms_norm_eps: args.layer_norm_eps,
        rope_scaling: args.rope_scaling,
    };
    c.refuse_rope_scaling("cohere2")?;
    let rope = c.rope(args.head_dim, args.rope_theta, true, None)?;
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let mut layer = LayerSpec {
                norms: NormLayout::Parallel,
                ..c.llama_layer(args.head_dim, rope.clone())
            };
            match (i + 1) % args.sliding_window_pattern {
                0 => layer.rope = None,
                _ => layer.shape.window = Some(args.sliding_window),
            }
            layer
        })
        .collect();
    sanitize(&mut weights, true);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: true,
        max_position_embeddings: None,
    };
    let family = Cohere2 {
        logit_scale: args.logit_scale,
    };
    Decoder::load(weights, spec, family)
}
