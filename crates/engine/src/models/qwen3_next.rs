//! Qwen3-Next: hybrid attention. Every `full_attention_interval`-th layer is softmax attention
//! (q/k norms per head, RoPE over the first `partial_rotary_factor` of each head, output gated
//! by a sigmoid of features the query projection also gives); the others are gated delta-nets
//! (linear attention with a recurrent state, `gated_delta.rs`). MLPs are sparse MoE with a
//! shared expert (dense in `mlp_only_layers`). A Hugging Face checkpoint (per-expert tensors)
//! stores its RMS norms as offsets from 1, which mlx-lm's sanitize adds back; its
//! multi-token-prediction tensors (`mtp.*`) are not used.

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::gated_delta::{DeltaProjections, GatedDeltaSpec},
    layers::moe::MoeSpec,
    layers::weights::Weights,
    layers::{scalar_like, QkNormOver, Result, Rope},
    models::{
        decoder::{sanitize, AttentionKind, CommonArgs, Decoder, DecoderSpec, Family, LayerSpec},
        model::parse_args,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    rope_theta: f32,
    partial_rotary_factor: f64,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_full_attention_interval")]
    full_attention_interval: usize,
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: usize,
    mlp_only_layers: Vec<usize>,
    #[serde(default)]
    norm_topk_prob: bool,
}

fn default_full_attention_interval() -> usize {
    4
}

/// Qwen3-Next's (and Qwen3.5's) norms: `1 + w` when the checkpoint stores offsets (mlx-lm's
/// sanitize shifts the block, q/k and final norms, not the delta-nets' gated norms).
pub struct Qwen3Next {
    pub shift_norms: bool,
}

impl Family for Qwen3Next {
    fn norm_weight(&self, stored: Array) -> Result<Array> {
        match self.shift_norms {
            true => stored.add(scalar_like(1.0, &stored)?),
            false => Ok(stored),
        }
    }
}

pub fn load(
    config: &Value,
    mut weights: Weights,
) -> std::result::Result<Decoder<Qwen3Next>, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let max_pos = Some(args.max_position_embeddings);
    // mlx-lm: `int(head_dim * partial_rotary_factor)` features rotated.
    let rotary = (args.head_dim as f64 * args.partial_rotary_factor) as i32;
    let rope = c.rope(rotary, args.rope_theta, false, max_pos)?;
    let linear = GatedDeltaSpec {
        projections: DeltaProjections::Grouped,
        num_k_heads: args.linear_num_key_heads,
        num_v_heads: args.linear_num_value_heads,
        head_k_dim: args.linear_key_head_dim,
        head_v_dim: args.linear_value_head_dim,
        conv_kernel: args.linear_conv_kernel_dim,
        rms_norm_eps: c.rms_norm_eps,
    };
    let mut spec = hybrid_layers(c, args.head_dim, rope, linear, args.full_attention_interval)?;
    spec.tie_word_embeddings = args.tie_word_embeddings;
    spec.max_position_embeddings = max_pos;
    let moe = MoeSpec::qwen3(
        args.num_experts,
        args.num_experts_per_tok,
        args.norm_topk_prob,
        true,
    );
    spec.make_sparse(&moe, args.decoder_sparse_step, &args.mlp_only_layers);
    // mlx-lm's sanitize does its work only on a Hugging Face checkpoint, which it knows by
    // per-expert tensors: there it also drops `mtp.*` and shifts the norms.
    let hf = weights
        .names()
        .any(|n| n.starts_with("model.layers.") && n.ends_with(".mlp.experts.0.up_proj.weight"));
    drop_mtp(&mut weights);
    sanitize(&mut weights, args.tie_word_embeddings);
    Decoder::load(weights, spec, Qwen3Next { shift_norms: hf })
}

/// `n` layers, every `interval`-th softmax attention (output-gated, per-head q/k norms, `rope`),
/// the others gated delta-nets; dense MLPs, untied, no position limit: the caller adjusts.
pub(super) fn hybrid_layers(
    c: &CommonArgs,
    head_dim: i32,
    rope: Rope,
    linear: GatedDeltaSpec,
    interval: usize,
) -> std::result::Result<DecoderSpec, EngineError> {
    if interval == 0 {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: `full_attention_interval` must be at least 1 (every that many layers \
             one is full attention)",
        ));
    }
    let full = LayerSpec {
        attention: AttentionKind::Softmax { output_gate: true },
        qk_norm: Some(QkNormOver::Head),
        ..c.llama_layer(head_dim, rope)
    };
    let mut spec = DecoderSpec::uniform(full, c.num_hidden_layers, false, None);
    for (i, layer) in spec.layers.iter_mut().enumerate() {
        if (i + 1) % interval != 0 {
            layer.attention = AttentionKind::GatedDelta(linear.clone());
        }
    }
    Ok(spec)
}

/// Drops the multi-token-prediction tensors (mlx-lm: every name containing `mtp.`).
pub(super) fn drop_mtp(weights: &mut Weights) {
    let mtp: Vec<String> = weights
        .names()
        .filter(|n| n.contains("mtp."))
        .cloned()
        .collect();
    for name in mtp {
        weights.remove(&name);
    }
}
