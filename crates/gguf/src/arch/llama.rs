//! Llama (and SmolLM2, which is a Llama): `LlamaForCausalLM` in Hugging Face terms.

use serde_json::{json, Map, Value};

use super::{
    config_with, hf_name, object, required_names, Hyperparameters, TensorTarget, Transform,
};

/// GGUF block tensor suffix -> Hugging Face suffix under `model.layers.N.`.
const BLOCK_TENSORS: [(&str, &str); 9] = [
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
];

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
    let (hf_name, suffix) = hf_name(gguf_name, hp.num_layers, &BLOCK_TENSORS)?;
    let transform = match suffix {
        "attn_q.weight" => Transform::UnpermuteHeads(hp.num_heads),
        "attn_k.weight" => Transform::UnpermuteHeads(hp.num_kv_heads),
        _ => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    required_names(hp.num_layers, &BLOCK_TENSORS)
}
