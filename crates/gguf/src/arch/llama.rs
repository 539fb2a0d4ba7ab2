//! Llama (and SmolLM2, which is a Llama): `LlamaForCausalLM` in Hugging Face terms.

use serde_json::{json, Map, Value};

use super::{
    config_with, hf_name, object, required_names, BlockTable, Hyperparameters, TensorTarget,
    Transform, ATTENTION, DENSE_MLP, PRE_NORMS,
};

/// The block tensors of a Llama layer.
const BLOCK: [&BlockTable; 3] = [&ATTENTION, &DENSE_MLP, &PRE_NORMS];

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
        }),
        hp,
    );
    config.extend(object(
        json!({ "attention_bias": false, "mlp_bias": false }),
    ));
    config
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let (hf_name, suffix) = hf_name(gguf_name, hp.num_layers, &BLOCK)?;
    let transform = match suffix {
        "attn_q.weight" => Transform::UnpermuteHeads(hp.num_heads),
        "attn_k.weight" => Transform::UnpermuteHeads(hp.num_kv_heads),
        _ => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    required_names(hp.num_layers, &BLOCK)
}
