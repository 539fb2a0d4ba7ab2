//! Qwen2 / Qwen2.5 (`general.architecture = qwen2`): `Qwen2ForCausalLM` in Hugging Face terms.
//!
//! A Llama block with biases on the q/k/v projections. llama.cpp runs Qwen2 with NeoX-style
//! RoPE, so its q/k rows are stored in the Hugging Face order (not regrouped as Llama's are).

use serde_json::{json, Map, Value};

use super::{
    config_with, object, rope_scaling, BlockTable, Hyperparameters, ATTENTION, DENSE_MLP, PRE_NORMS,
};

/// The q/k/v biases (Qwen2 has none on the output projection).
const QKV_BIASES: [(&str, &str); 3] = [
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
];

/// The block tensors of a Qwen2 layer.
pub(super) const BLOCK: [&BlockTable; 4] = [&ATTENTION, &QKV_BIASES, &DENSE_MLP, &PRE_NORMS];

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
        }),
        hp,
    );
    config.extend(object(json!({ "rope_scaling": rope_scaling(hp) })));
    config
}
