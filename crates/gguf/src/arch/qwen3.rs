//! Qwen3 dense models (`general.architecture = qwen3`): `Qwen3ForCausalLM` in Hugging Face
//! terms.
//!
//! A Llama block with per-head RMSNorms on queries and keys and a head size of its own
//! (`attention.key_length`). NeoX-style RoPE in llama.cpp: q/k rows are stored in the Hugging
//! Face order.

use serde_json::{json, Map, Value};

use super::{
    config_with, object, rope_scaling, BlockTable, Hyperparameters, ATTENTION, DENSE_MLP,
    PRE_NORMS, QK_NORMS,
};

/// The block tensors of a Qwen3 layer.
pub(super) const BLOCK: [&BlockTable; 4] = [&ATTENTION, &QK_NORMS, &DENSE_MLP, &PRE_NORMS];

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_act": "silu",
        }),
        hp,
    );
    config.extend(object(json!({
        "rope_scaling": rope_scaling(hp),
        "attention_bias": false,
    })));
    config
}
