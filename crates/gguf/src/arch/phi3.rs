//! Phi-3 / Phi-3.5 / Phi-4-mini (`general.architecture = phi3`): `Phi3ForCausalLM` in Hugging
//! Face terms.
//!
//! Fused projections on both sides: `attn_qkv` is `qkv_proj` (q, k, v rows in that order) and
//! `ffn_up` holds the gate and up rows of `gate_up_proj` (gate first). NeoX-style RoPE in
//! llama.cpp (q/k rows in the Hugging Face order), over `rope.dimension_count` features of a head
//! (Phi-4-mini rotates three quarters). LongRoPE's factor tensors (`rope_factors_long/short`) are
//! not imported: such a file is refused by name.

use serde_json::{json, Map, Value};

use super::{config_with, object, BlockTable, Hyperparameters, PRE_NORMS};

/// Phi-3's fused projections.
const FUSED: [(&str, &str); 4] = [
    ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_up.weight", "mlp.gate_up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// The block tensors of a Phi-3 layer.
pub(super) const BLOCK: [&BlockTable; 2] = [&FUSED, &PRE_NORMS];

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let mut config = config_with(
        json!({
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "hidden_act": "silu",
        }),
        hp,
    );
    let rotated = hp.rope_dimensions.unwrap_or(hp.head_dim);
    config.extend(object(json!({
        "partial_rotary_factor": rotated as f64 / hp.head_dim as f64,
        "original_max_position_embeddings": hp.original_context_length.unwrap_or(hp.context_length),
        "rope_scaling": null,
    })));
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_projections_and_partial_rotation() {
        let hp = Hyperparameters {
            hidden_size: 3072,
            intermediate_size: 8192,
            num_layers: 1,
            num_heads: 24,
            num_kv_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            context_length: 131072,
            rope_dimensions: Some(96),
            original_context_length: Some(4096),
            ..Default::default()
        };
        let config = config(&hp);
        assert_eq!(config["partial_rotary_factor"], 0.75);
        assert_eq!(config["original_max_position_embeddings"], 4096);
        let t = |name: &str| {
            super::super::Architecture::Phi3
                .target(name, &hp)
                .map(|t| t.hf_name)
        };
        assert_eq!(
            t("blk.0.attn_qkv.weight").as_deref(),
            Some("model.layers.0.self_attn.qkv_proj.weight")
        );
        assert_eq!(
            t("blk.0.ffn_up.weight").as_deref(),
            Some("model.layers.0.mlp.gate_up_proj.weight")
        );
        assert_eq!(t("rope_factors_long.weight"), None, "LongRoPE is refused");
        assert_eq!(
            super::super::Architecture::Phi3.required_tensors(&hp).len(),
            2 + 6
        );
    }
}
