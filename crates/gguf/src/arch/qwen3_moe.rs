//! Qwen3 mixtures of experts (`general.architecture = qwen3moe`): `Qwen3MoeForCausalLM` in
//! Hugging Face terms.
//!
//! Qwen3's attention; every layer's MLP is a router (`ffn_gate_inp`) over experts that GGUF
//! stores stacked, one 3-D tensor per projection (`ffn_{gate,up,down}_exps`, experts first).
//! They are written stacked as mlx-lm holds them (`mlp.switch_mlp.<proj>`), which the engine
//! and mlx-lm load as they are. GGUF has no key for dense layers among the experts
//! (`mlp_only_layers`): llama.cpp makes every layer sparse, and so does the config written here.
//! The top-k weights are renormalized unless `expert_weights_norm` says false (llama.cpp's
//! qwen3moe default).

use serde_json::{json, Map, Value};

use super::{
    config_with, object, rope_scaling, BlockTable, Hyperparameters, ATTENTION, PRE_NORMS, QK_NORMS,
};

/// The router and the stacked experts.
const EXPERTS: [(&str, &str); 4] = [
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate_exps.weight", "mlp.switch_mlp.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.switch_mlp.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.switch_mlp.down_proj.weight"),
];

/// The block tensors of a Qwen3-MoE layer.
pub(super) const BLOCK: [&BlockTable; 4] = [&ATTENTION, &QK_NORMS, &EXPERTS, &PRE_NORMS];

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
        "norm_topk_prob": experts.normalize.unwrap_or(true),
        "rope_scaling": rope_scaling(hp),
        "attention_bias": false,
    })));
    config
}

#[cfg(test)]
mod tests {
    use super::super::{check_experts, Experts};
    use super::*;

    fn hp(experts: Option<Experts>) -> Hyperparameters {
        Hyperparameters {
            hidden_size: 2048,
            intermediate_size: 6144,
            num_layers: 2,
            num_heads: 32,
            num_kv_heads: 4,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            context_length: 40960,
            experts,
            ..Default::default()
        }
    }

    #[test]
    fn experts_stay_stacked_and_sizes_come_from_the_metadata() {
        let experts = Experts {
            count: 128,
            used: 8,
            feed_forward_length: 768,
            normalize: None,
        };
        let hp = hp(Some(experts));
        assert!(check_experts(&hp, "qwen3moe").is_ok());
        let config = config(&hp);
        assert_eq!(config["num_experts"], 128);
        assert_eq!(config["num_experts_per_tok"], 8);
        assert_eq!(config["moe_intermediate_size"], 768);
        assert_eq!(config["norm_topk_prob"], true);
        let unnormalized = Hyperparameters {
            experts: Some(Experts {
                normalize: Some(false),
                ..experts
            }),
            ..hp.clone()
        };
        assert_eq!(super::config(&unnormalized)["norm_topk_prob"], false);
        let t = |name: &str| {
            super::super::Architecture::Qwen3Moe
                .target(name, &hp)
                .map(|t| t.hf_name)
        };
        assert_eq!(
            t("blk.1.ffn_down_exps.weight").as_deref(),
            Some("model.layers.1.mlp.switch_mlp.down_proj.weight")
        );
        assert_eq!(
            t("blk.0.ffn_gate_inp.weight").as_deref(),
            Some("model.layers.0.mlp.gate.weight")
        );
        assert_eq!(t("blk.0.ffn_gate.weight"), None, "no dense MLP");
        assert_eq!(
            super::super::Architecture::Qwen3Moe
                .required_tensors(&hp)
                .len(),
            2 + 2 * 12
        );
    }

    #[test]
    fn refuses_a_file_without_expert_counts() {
        assert!(check_experts(&hp(None), "qwen3moe").is_err());
        let too_many = Experts {
            count: 4,
            used: 5,
            feed_forward_length: 64,
            normalize: None,
        };
        assert!(check_experts(&hp(Some(too_many)), "qwen3moe").is_err());
    }
}
