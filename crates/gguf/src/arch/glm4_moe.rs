//! GLM-4 MoE (`general.architecture = glm4moe`, GLM-4.5 / 4.6 / 4.7): `Glm4MoeForCausalLM` in
//! Hugging Face terms.
//!
//! Attention with q/k/v biases (where the file has `attn_q.bias`) and per-head q/k norms (where
//! it has `attn_q_norm`), half of each head rotated NeoX-style (`rope.dimension_count`; q/k
//! rows in the Hugging Face order); pre- and post-attention norms (llama.cpp's
//! `post_attention_norm`); the first `leading_dense_block_count` layers dense, the others a
//! sigmoid router with a correction bias (`exp_probs_b.bias`) over stacked experts plus shared
//! experts (`*_shexp`). The releases' multi-token-prediction layer is stored as the last
//! `nextn_predict_layers` blocks (`block_count` counts them): mlx-lm drops it, and so does the
//! import. GGUF stores no expert groups: the releases route over one group.

use serde_json::{json, Map, Value};

use super::{
    config_with, object, rope_scaling, BlockTable, Hyperparameters, TensorTarget, Transform,
    ATTENTION, DENSE_MLP, QK_NORMS,
};

const NORMS: [(&str, &str); 2] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
];

const BIASES: [(&str, &str); 3] = [
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
];

/// The router, its correction bias, the stacked experts and the shared experts.
const EXPERTS: [(&str, &str); 8] = [
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn_gate_exps.weight", "mlp.switch_mlp.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.switch_mlp.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.switch_mlp.down_proj.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_experts.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_experts.down_proj.weight",
    ),
];

fn layer_tables(hp: &Hyperparameters, layer: usize) -> Vec<&'static BlockTable> {
    let mut tables: Vec<&BlockTable> = vec![&ATTENTION, &NORMS];
    if hp.attention_bias {
        tables.push(&BIASES);
    }
    if hp.qk_norm {
        tables.push(&QK_NORMS);
    }
    match layer < hp.leading_dense_blocks.unwrap_or(0) {
        true => tables.push(&DENSE_MLP),
        false => tables.push(&EXPERTS),
    }
    tables
}

/// The layer a block tensor belongs to.
fn layer_of(gguf_name: &str) -> Option<usize> {
    let rest = gguf_name.strip_prefix("blk.")?;
    rest.split_once('.')?.0.parse().ok()
}

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "hidden_act": "silu",
        }),
        hp,
    );
    let experts = hp.experts.unwrap_or_default();
    let rotated = hp.rope_dimensions.unwrap_or(hp.head_dim / 2);
    config.extend(object(json!({
        "partial_rotary_factor": rotated as f64 / hp.head_dim as f64,
        "attention_bias": hp.attention_bias,
        "use_qk_norm": hp.qk_norm,
        "first_k_dense_replace": hp.leading_dense_blocks.unwrap_or(0),
        "n_routed_experts": experts.count,
        "num_experts_per_tok": experts.used,
        "moe_intermediate_size": experts.feed_forward_length,
        "n_shared_experts": hp.shared_experts.unwrap_or(0),
        // The converter writes these only where config.json has them; transformers'
        // Glm4MoeConfig defaults (the model's meaning without them) are 1.0 and true.
        "routed_scaling_factor": hp.expert_weights_scale.unwrap_or(1.0),
        "norm_topk_prob": experts.normalize.unwrap_or(true),
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "rope_scaling": rope_scaling(hp),
    })));
    config
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let layer = layer_of(gguf_name);
    // The multi-token-prediction blocks after the model's layers.
    if let Some(l) = layer.filter(|&l| l >= hp.num_layers) {
        return (l < hp.num_layers + hp.nextn_layers).then(|| TensorTarget {
            hf_name: gguf_name.to_owned(),
            transform: Transform::Drop,
        });
    }
    super::renamed(gguf_name, hp, &layer_tables(hp, layer.unwrap_or(0)))
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    let mut names = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".to_owned(),
    ];
    for layer in 0..hp.num_layers {
        for (_, hf) in layer_tables(hp, layer).iter().flat_map(|t| t.iter()) {
            names.push(format!("model.layers.{layer}.{hf}"));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::super::{Architecture, Experts};
    use super::*;

    fn hp() -> Hyperparameters {
        Hyperparameters {
            hidden_size: 4096,
            intermediate_size: 10944,
            num_layers: 46,
            num_heads: 96,
            num_kv_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 1e6,
            context_length: 131072,
            rope_dimensions: Some(64),
            experts: Some(Experts {
                count: 128,
                used: 8,
                feed_forward_length: 1408,
                normalize: Some(true),
            }),
            shared_experts: Some(1),
            leading_dense_blocks: Some(1),
            expert_weights_scale: Some(1.0),
            nextn_layers: 1,
            attention_bias: true,
            ..Default::default()
        }
    }

    #[test]
    fn dense_then_sparse_layers_and_the_prediction_layer_dropped() {
        let hp = hp();
        let t = |name: &str| Architecture::Glm4Moe.target(name, &hp);
        let name = |n: &str| t(n).map(|t| t.hf_name);
        assert_eq!(
            name("blk.0.ffn_gate.weight").as_deref(),
            Some("model.layers.0.mlp.gate_proj.weight")
        );
        assert_eq!(name("blk.0.ffn_gate_exps.weight"), None, "layer 0 is dense");
        assert_eq!(
            name("blk.1.exp_probs_b.bias").as_deref(),
            Some("model.layers.1.mlp.gate.e_score_correction_bias")
        );
        assert_eq!(
            name("blk.45.post_attention_norm.weight").as_deref(),
            Some("model.layers.45.post_attention_layernorm.weight")
        );
        assert_eq!(name("blk.45.attn_q_norm.weight"), None, "no q/k norms");
        assert_eq!(
            t("blk.46.nextn.eh_proj.weight").unwrap().transform,
            Transform::Drop
        );
        assert_eq!(
            t("blk.46.attn_q.weight").unwrap().transform,
            Transform::Drop
        );
        assert!(
            t("blk.47.attn_q.weight").is_none(),
            "past the prediction layer"
        );
        let config = config(&hp);
        assert_eq!(config["num_hidden_layers"], 46);
        assert_eq!(config["partial_rotary_factor"], 0.5);
        assert_eq!(config["first_k_dense_replace"], 1);
        assert_eq!(config["attention_bias"], true);
        // Layer 0: 4 attention + 2 norms + 3 biases + 3 dense; then 8 expert tensors each.
        let required = Architecture::Glm4Moe.required_tensors(&hp);
        assert_eq!(required.len(), 2 + 12 + 45 * 17);
    }
}
