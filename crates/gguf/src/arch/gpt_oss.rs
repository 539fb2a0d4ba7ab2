//! GPT-OSS (`general.architecture = gpt-oss`): `GptOssForCausalLM` in Hugging Face terms, in
//! the layout mlx-lm holds it (router `mlp.router`, experts stacked as `mlp.experts.<proj>`,
//! which the engine and mlx-lm load as they are).
//!
//! Biases on every attention projection and on the router and experts; a learned attention
//! sink per head (`attn_sinks`). NeoX-style RoPE in llama.cpp: q/k rows in the Hugging Face
//! order. What GGUF leaves implicit comes from llama.cpp's loader: layers alternate sliding and
//! full attention starting with a sliding one, the SwiGLU clamp is 7, and YaRN's betas are 32
//! and 1 (what the released config.json has, with `truncate: false`). Experts stored as MXFP4
//! are dequantized like any other tensor; a fused `ffn_gate_up_exps` is refused by name.

use serde_json::{json, Map, Value};

use super::{config_with, object, BlockTable, Hyperparameters, ATTENTION};

/// Attention biases, sinks and norms, router and experts.
const GPT_OSS: [(&str, &str); 15] = [
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_sinks.weight", "self_attn.sinks"),
    ("attn_norm.weight", "input_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("ffn_gate_inp.weight", "mlp.router.weight"),
    ("ffn_gate_inp.bias", "mlp.router.bias"),
    ("ffn_gate_exps.weight", "mlp.experts.gate_proj.weight"),
    ("ffn_gate_exps.bias", "mlp.experts.gate_proj.bias"),
    ("ffn_up_exps.weight", "mlp.experts.up_proj.weight"),
    ("ffn_up_exps.bias", "mlp.experts.up_proj.bias"),
    ("ffn_down_exps.weight", "mlp.experts.down_proj.weight"),
    ("ffn_down_exps.bias", "mlp.experts.down_proj.bias"),
];

/// The block tensors of a GPT-OSS layer.
pub(super) const BLOCK: [&BlockTable; 2] = [&ATTENTION, &GPT_OSS];

/// llama.cpp's SwiGLU clamp for gpt-oss (the released config's `swiglu_limit`).
const SWIGLU_LIMIT: f64 = 7.0;
/// Sliding window when the file does not say (the released models').
const DEFAULT_SLIDING_WINDOW: usize = 128;

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let experts = hp.experts.unwrap_or_default();
    let layer_types: Vec<&str> = (0..hp.num_layers)
        .map(|i| match i % 2 {
            0 => "sliding_attention",
            _ => "full_attention",
        })
        .collect();
    let rope_scaling = match &hp.rope_scaling {
        Some((kind, factor)) => json!({
            "rope_type": kind,
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": hp.original_context_length,
            "truncate": false,
        }),
        None => Value::Null,
    };
    let mut config = config_with(
        json!({
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "hidden_act": "silu",
        }),
        hp,
    );
    config.extend(object(json!({
        "intermediate_size": experts.feed_forward_length,
        "num_local_experts": experts.count,
        "num_experts_per_tok": experts.used,
        "sliding_window": hp.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW),
        "layer_types": layer_types,
        "rope_scaling": rope_scaling,
        "swiglu_limit": SWIGLU_LIMIT,
        "attention_bias": true,
    })));
    config
}
