//! Llama (and SmolLM2, which is a Llama): `LlamaForCausalLM` in Hugging Face terms.

use serde_json::{json, Map, Value};

use super::{Hyperparameters, TensorTarget, Transform};

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
    let value = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hp.hidden_size,
        "intermediate_size": hp.intermediate_size,
        "num_hidden_layers": hp.num_layers,
        "num_attention_heads": hp.num_heads,
        "num_key_value_heads": hp.num_kv_heads,
        "head_dim": hp.head_dim,
        "rms_norm_eps": hp.rms_norm_eps,
        "rope_theta": hp.rope_theta,
        "max_position_embeddings": hp.context_length,
        "attention_bias": false,
        "mlp_bias": false,
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object literal"),
    }
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let plain = |hf_name: &str| {
        Some(TensorTarget {
            hf_name: hf_name.to_owned(),
            transform: Transform::None,
        })
    };
    match gguf_name {
        "token_embd.weight" => return plain("model.embed_tokens.weight"),
        "output_norm.weight" => return plain("model.norm.weight"),
        "output.weight" => return plain("lm_head.weight"),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|&l| l < hp.num_layers)?;
    let (_, hf_suffix) = BLOCK_TENSORS.iter().find(|(g, _)| *g == suffix)?;
    let transform = match suffix {
        "attn_q.weight" => Transform::UnpermuteHeads(hp.num_heads),
        "attn_k.weight" => Transform::UnpermuteHeads(hp.num_kv_heads),
        _ => Transform::None,
    };
    Some(TensorTarget {
        hf_name: format!("model.layers.{layer}.{hf_suffix}"),
        transform,
    })
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    let mut names = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".to_owned(),
    ];
    for layer in 0..hp.num_layers {
        for (_, hf_suffix) in BLOCK_TENSORS {
            names.push(format!("model.layers.{layer}.{hf_suffix}"));
        }
    }
    names
}
