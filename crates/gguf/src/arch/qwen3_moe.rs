//! Qwen3 mixtures of experts (`general.architecture = qwen3moe`): `Qwen3MoeForCausalLM` in
//! Hugging Face terms.
//!
//! Qwen3's attention; every layer's MLP is a router (`ffn_gate_inp`) over experts that GGUF
//! stores stacked, one 3-D tensor per projection (`ffn_{gate,up,down}_exps`, experts first).
//! They are written stacked as mlx-lm holds them (`mlp.switch_mlp.<proj>`), which the engine
//! and mlx-lm load as they are. GGUF has no key for dense layers among the experts
//! (`mlp_only_layers`) nor for normalizing the top-k weights: llama.cpp makes every layer sparse
//! and always normalizes for qwen3moe, and so does the config written here.

use serde_json::{json, Map, Value};

use super::{
    config_with, object, renamed, required_names, rope_scaling, BlockTable, Hyperparameters,
    TensorTarget, ATTENTION, PRE_NORMS, QK_NORMS,
};
use crate::ImportError;

/// The router and the stacked experts.
const EXPERTS: [(&str, &str); 4] = [
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate_exps.weight", "mlp.switch_mlp.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.switch_mlp.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.switch_mlp.down_proj.weight"),
];

/// The block tensors of a Qwen3-MoE layer.
const BLOCK: [&BlockTable; 4] = [&ATTENTION, &QK_NORMS, &EXPERTS, &PRE_NORMS];

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_act": "silu",
        }),
        hp,
    );
    let experts = hp.experts.unwrap_or_default();
    config.extend(object(json!({
        "num_experts": experts.count,
        "num_experts_per_tok": experts.used,
        "moe_intermediate_size": experts.feed_forward_length,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": true,
        "rope_scaling": rope_scaling(hp),
        "attention_bias": false,
    })));
    config
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    renamed(gguf_name, hp, &BLOCK)
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    required_names(hp.num_layers, &BLOCK)
}

/// The expert sizes the metadata must give.
pub(super) fn check(hp: &Hyperparameters) -> Result<(), ImportError> {
    match hp.experts {
        Some(e) if e.used > 0 && e.used <= e.count => Ok(()),
        _ => Err(ImportError::Inconsistent(
            "qwen3moe.expert_count and qwen3moe.expert_used_count must be given, with \
             0 < used <= count"
                .into(),
        )),
    }
}
