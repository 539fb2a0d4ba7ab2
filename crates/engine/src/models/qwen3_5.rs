//! Qwen3.5 (text): Qwen3-Next's hybrid layers (`qwen3_next.rs`) with the delta-nets'
//! projections stored separately (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), RoPE
//! from `rope_parameters`, and every MLP dense (or, with `num_experts`, sparse with a shared
//! expert). The language model of a Qwen3.5 or Qwen3.5-MoE checkpoint (config in `text_config`
//! or flat; `models::language_model` finds the tensors); the vision tower is not used. Experts in
//! Hugging Face's fused layout (`experts.gate_up_proj`, `experts.down_proj`) become mlx-lm's
//! `switch_mlp` (mlx-lm's qwen3_5_moe.py).
//! Norms are stored as offsets from 1 when the convolution weights are in Hugging Face's layout,
//! which is mlx-lm's test for a checkpoint it has not converted.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::EngineError,
    layers::gated_delta::{DeltaProjections, GatedDeltaSpec},
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec},
    layers::weights::Weights,
    models::{
        decoder::{sanitize, AttentionKind, CommonArgs, Decoder},
        model::parse_args,
        qwen3_next::{drop_mtp, hybrid_layers, Qwen3Next},
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: Option<i32>,
    #[serde(default = "default_max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_full_attention_interval")]
    full_attention_interval: usize,
    #[serde(default = "default_linear_value_heads")]
    linear_num_value_heads: i32,
    #[serde(default = "default_linear_key_heads")]
    linear_num_key_heads: i32,
    #[serde(default = "default_linear_key_head_dim")]
    linear_key_head_dim: i32,
    #[serde(default = "default_linear_value_head_dim")]
    linear_value_head_dim: i32,
    #[serde(default = "default_conv_kernel")]
    linear_conv_kernel_dim: i32,
    #[serde(default)]
    num_experts: i32,
    #[serde(default)]
    num_experts_per_tok: i32,
    #[serde(default = "default_true")]
    norm_topk_prob: bool,
    /// Absent: mlx-lm's default (plain RoPE, theta 1e5, a quarter of each head rotated).
    #[serde(default = "default_rope_parameters")]
    rope_parameters: Value,
    /// Layers of the multi-token-prediction head (`mtp.*`), loaded as a drafter.
    #[serde(default)]
    mtp_num_hidden_layers: usize,
}

fn default_max_position_embeddings() -> usize {
    131072
}
fn default_full_attention_interval() -> usize {
    4
}
fn default_linear_value_heads() -> i32 {
    64
}
fn default_linear_key_heads() -> i32 {
    16
}
fn default_linear_key_head_dim() -> i32 {
    192
}
fn default_linear_value_head_dim() -> i32 {
    128
}
fn default_conv_kernel() -> i32 {
    4
}
fn default_true() -> bool {
    true
}
fn default_rope_parameters() -> Value {
    json!({"type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25})
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<Qwen3Next>, EngineError> {
    let args: Args = parse_args(config.get("text_config").unwrap_or(config))?;
    let c = &args.common;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let rope_config = &args.rope_parameters;
    let get = |key: &str, default: f64| {
        rope_config
            .get(key)
            .and_then(Value::as_f64)
            .unwrap_or(default)
    };
    let rotary = (head_dim as f64 * get("partial_rotary_factor", 0.25)) as i32;
    let max_pos = Some(args.max_position_embeddings);
    // mlx-lm passes `rope_parameters` as the scaling config (its `mrope_section` is unused).
    let rope = crate::layers::rope::rope_from_config(
        rotary,
        get("rope_theta", 100000.0) as f32,
        false,
        Some(rope_config),
        max_pos,
    )?;
    let linear = GatedDeltaSpec {
        projections: DeltaProjections::Separate,
        num_k_heads: args.linear_num_key_heads,
        num_v_heads: args.linear_num_value_heads,
        head_k_dim: args.linear_key_head_dim,
        head_v_dim: args.linear_value_head_dim,
        conv_kernel: args.linear_conv_kernel_dim,
        rms_norm_eps: c.rms_norm_eps,
    };
    let mut spec = hybrid_layers(c, head_dim, rope, linear, args.full_attention_interval)?;
    spec.tie_word_embeddings = args.tie_word_embeddings;
    spec.max_position_embeddings = max_pos;
    if args.num_experts > 0 {
        let (experts, k) = (args.num_experts, args.num_experts_per_tok);
        let moe = MoeSpec::qwen3(experts, k, args.norm_topk_prob, true);
        spec.make_sparse(&moe, 1, &[]);
    }
    let hf = weights
        .names()
        .filter(|n| n.contains("conv1d.weight"))
        .any(|n| weights.shape(n).and_then(|s| s.last().copied()) != Some(1));
    let mut mtp = weights.split_off("mtp.");
    drop_mtp(&mut weights);
    for part in [&mut weights, &mut mtp] {
        split_fused_experts(part, FusedExperts::Rows, |mlp| format!("{mlp}.switch_mlp"))?;
    }
    sanitize(&mut weights, args.tie_word_embeddings);
    // The head's layers are full attention, as the model's.
    let full = (spec.layers.iter().rev())
        .find(|l| matches!(l.attention, AttentionKind::Softmax { .. }))
        .cloned();
    let decoder = Decoder::load(weights, spec, Qwen3Next { shift_norms: hf })?;
    match full {
        Some(layer) => decoder.with_mtp(mtp, args.mtp_num_hidden_layers, &layer),
        None => Ok(decoder),
    }
}
