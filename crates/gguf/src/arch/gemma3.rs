//! Gemma 3 text models (`general.architecture = gemma3`): `Gemma3ForCausalLM` /
//! `model_type: gemma3_text` in Hugging Face terms, the shape mlx-lm's `gemma3_text` reads.
//!
//! What differs from Llama on the way back from GGUF (evidence in docs/decisions/gguf-norm-shift.md):
//! - every RMSNorm weight (block norms, q/k norms, final norm) is stored by llama.cpp as `1 + w`;
//!   Hugging Face stores `w` (the model computes `x * (1 + w)`), so 1 is subtracted;
//! - q/k rows are *not* permuted: llama.cpp runs Gemma with NeoX-style RoPE (rotary halves
//!   apart), which is the Hugging Face layout already;
//! - what GGUF leaves implicit comes from llama.cpp's loader: sliding-window layers use a RoPE
//!   base of 10000 and every 6th layer is global.

use serde_json::{json, Map, Value};

use super::{
    config_with, hf_name, object, rope_scaling, BlockTable, Hyperparameters, TensorTarget,
    Transform, ATTENTION, DENSE_MLP, QK_NORMS,
};

/// Gemma's four block norms: before and after attention, before and after the MLP (checked
/// against gguf-py's tensor map for GEMMA3).
const NORMS: [(&str, &str); 4] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
];

/// The block tensors of a Gemma 3 layer.
pub(super) const BLOCK: [&BlockTable; 4] = [&ATTENTION, &QK_NORMS, &DENSE_MLP, &NORMS];

/// One global-attention layer in every this many (llama.cpp sets the same pattern for gemma3;
/// GGUF has no key for it).
const SLIDING_WINDOW_PATTERN: usize = 6;
/// RoPE base of the sliding-window layers when the file does not say (llama.cpp's default).
const LOCAL_ROPE_THETA: f64 = 10_000.0;
/// Sliding window when the file does not say (mlx-lm's default).
const DEFAULT_SLIDING_WINDOW: usize = 512;
/// Gemma 3 27B is the only size that scales scores by `hidden / heads` rather than `head_dim`
/// (llama.cpp's rule, after Google's gemma_pytorch config); llama.cpp knows it by layer count.
const LAYERS_27B: usize = 62;

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let query_pre_attn_scalar = if hp.num_layers == LAYERS_27B {
        hp.hidden_size / hp.num_heads
    } else {
        hp.head_dim
    };
    let layer_types: Vec<&str> = (0..hp.num_layers)
        .map(|i| match (i + 1) % SLIDING_WINDOW_PATTERN {
            0 => "full_attention",
            _ => "sliding_attention",
        })
        .collect();
    let mut config = config_with(
        json!({
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
        }),
        hp,
    );
    config.extend(object(json!({
        "rope_local_base_freq": hp.rope_theta_swa.unwrap_or(LOCAL_ROPE_THETA),
        "rope_scaling": rope_scaling(hp),
        "sliding_window": hp.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW),
        "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
        "layer_types": layer_types,
        "query_pre_attn_scalar": query_pre_attn_scalar,
        "attention_bias": false,
        "final_logit_softcapping": null,
        "attn_logit_softcapping": null,
    })));
    config
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let (hf_name, suffix) = hf_name(gguf_name, hp.num_layers, &BLOCK)?;
    let transform = match suffix.ends_with("norm.weight") {
        true => Transform::SubtractOne,
        false => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(num_layers: usize) -> Hyperparameters {
        Hyperparameters {
            hidden_size: 5376,
            intermediate_size: 21504,
            num_layers,
            num_heads: 32,
            num_kv_heads: 16,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            context_length: 131072,
            sliding_window: Some(1024),
            rope_theta_swa: None,
            rope_scaling: Some(("linear".into(), 8.0)),
            ..Default::default()
        }
    }

    #[test]
    fn query_scale_layer_types_and_rope_scaling() {
        let big = config(&hp(LAYERS_27B));
        assert_eq!(big["query_pre_attn_scalar"], 168, "27B: hidden / heads");
        assert_eq!(config(&hp(48))["query_pre_attn_scalar"], 128, "head_dim");
        assert_eq!(
            big["rope_scaling"],
            json!({ "rope_type": "linear", "factor": 8.0 })
        );
        assert_eq!(big["rope_local_base_freq"], 10_000.0);
        assert_eq!(big["sliding_window"], 1024);
        let types = big["layer_types"].as_array().unwrap();
        assert_eq!(types.len(), LAYERS_27B);
        assert_eq!(types[4], "sliding_attention");
        assert_eq!(types[5], "full_attention");
    }

    #[test]
    fn norms_are_shifted_and_nothing_is_permuted() {
        let hp = hp(2);
        let t = |name: &str| target(name, &hp).map(|t| (t.hf_name, t.transform));
        assert_eq!(
            t("blk.1.ffn_norm.weight"),
            Some((
                "model.layers.1.pre_feedforward_layernorm.weight".into(),
                Transform::SubtractOne
            ))
        );
        assert_eq!(
            t("output_norm.weight"),
            Some(("model.norm.weight".into(), Transform::SubtractOne))
        );
        assert_eq!(
            t("blk.0.attn_q.weight"),
            Some((
                "model.layers.0.self_attn.q_proj.weight".into(),
                Transform::None
            ))
        );
        assert_eq!(t("blk.2.attn_q.weight"), None, "layer out of range");
        assert_eq!(
            super::super::Architecture::Gemma3
                .required_tensors(&hp)
                .len(),
            2 + 2 * 13
        );
    }
}
