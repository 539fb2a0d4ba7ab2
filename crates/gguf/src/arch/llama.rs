//! Llama (and SmolLM2, which is a Llama): `LlamaForCausalLM` in Hugging Face terms. llama.cpp
//! also converts Mistral (a Llama for mlx-lm) and Mixtral as `llama`: a file with
//! `llama.expert_count` is a Mixtral (`MixtralForCausalLM`), its experts stacked
//! (`ffn_{gate,up,down}_exps`) and written stacked as mlx-lm holds them
//! (`block_sparse_moe.switch_mlp.<proj>`), which the engine and mlx-lm load as they are.

use serde_json::{json, Map, Value};

use super::{
    config_with, hf_name, object, BlockTable, Hyperparameters, TensorTarget, Transform, ATTENTION,
    DENSE_MLP, PRE_NORMS,
};

/// The block tensors of a Llama layer.
const BLOCK: [&BlockTable; 3] = [&ATTENTION, &DENSE_MLP, &PRE_NORMS];

/// Mixtral's router and stacked experts.
const MIXTRAL_EXPERTS: [(&str, &str); 4] = [
    ("ffn_gate_inp.weight", "block_sparse_moe.gate.weight"),
    (
        "ffn_gate_exps.weight",
        "block_sparse_moe.switch_mlp.gate_proj.weight",
    ),
    (
        "ffn_up_exps.weight",
        "block_sparse_moe.switch_mlp.up_proj.weight",
    ),
    (
        "ffn_down_exps.weight",
        "block_sparse_moe.switch_mlp.down_proj.weight",
    ),
];

/// The block tensors of a Mixtral layer.
const MIXTRAL_BLOCK: [&BlockTable; 3] = [&ATTENTION, &MIXTRAL_EXPERTS, &PRE_NORMS];

pub(super) fn block(hp: &Hyperparameters) -> &'static [&'static BlockTable] {
    match hp.experts {
        Some(_) => &MIXTRAL_BLOCK,
        None => &BLOCK,
    }
}

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let Some(experts) = hp.experts else {
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
        return config;
    };
    let mut config = config_with(
        json!({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "hidden_act": "silu",
        }),
        hp,
    );
    config.extend(object(json!({
        "intermediate_size": experts.feed_forward_length,
        "num_local_experts": experts.count,
        "num_experts_per_tok": experts.used,
    })));
    config
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let (hf_name, suffix) = hf_name(gguf_name, hp.num_layers, block(hp))?;
    let transform = match suffix {
        "attn_q.weight" => Transform::UnpermuteHeads(hp.num_heads),
        "attn_k.weight" => Transform::UnpermuteHeads(hp.num_kv_heads),
        _ => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}
