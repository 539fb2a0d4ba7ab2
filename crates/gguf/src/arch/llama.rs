//! Llama (and SmolLM2, which is a Llama): `LlamaForCausalLM` in Hugging Face terms. llama.cpp
//! also converts Mistral (a Llama for mlx-lm) and Mixtral as `llama`: a file with
//! `llama.expert_count` is a Mixtral (`MixtralForCausalLM`), its experts stacked
//! (`ffn_{gate,up,down}_exps`) and written stacked as mlx-lm holds them
//! (`block_sparse_moe.switch_mlp.<proj>`), which the engine and mlx-lm load as they are.
//!
//! Llama 3.1+'s RoPE scaling has no metadata key: the converter stores its per-frequency
//! factors as a tensor (`rope_freqs.weight`). The import recovers the scaling from it
//! ([`llama3_rope`]) and writes it back as config.json's `rope_scaling`.

use serde_json::{json, Map, Value};

use crate::{GgufFile, ImportError};

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
        if let Some(rope) = hp.llama3_rope {
            config.insert("rope_scaling".into(), rope.config());
        }
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
    // Read into config.json's `rope_scaling` ([`llama3_rope`]).
    if gguf_name == "rope_freqs.weight" && hp.llama3_rope.is_some() {
        return Some(TensorTarget {
            hf_name: gguf_name.to_owned(),
            transform: Transform::Drop,
        });
    }
    let (hf_name, suffix) = hf_name(gguf_name, hp.num_layers, block(hp))?;
    let transform = match suffix {
        "attn_q.weight" => Transform::UnpermuteHeads(hp.num_heads),
        "attn_k.weight" => Transform::UnpermuteHeads(hp.num_kv_heads),
        _ => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}

/// Llama 3's RoPE scaling (Hugging Face's `rope_scaling` with `rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

impl Llama3Rope {
    /// Every Llama 3.x release's, but the factor (8 for 3.1 and 3.3, 32 for 3.2).
    fn meta(factor: f64) -> Self {
        Self {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        }
    }

    fn config(self) -> Value {
        json!({
            "rope_type": "llama3",
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings as u64,
        })
    }

    /// The factor the converter stores for each of a head's `dim / 2` frequencies of base
    /// `base` (its `generate_extra_tensors`): 1 for wavelengths under `original / high`,
    /// `factor` over `original / low`, a smooth blend between.
    fn factors(self, base: f64, dim: usize) -> Vec<f64> {
        let (low, high) = (self.low_freq_factor, self.high_freq_factor);
        let original = self.original_max_position_embeddings;
        (0..dim)
            .step_by(2)
            .map(|i| {
                let freq = 1.0 / base.powf(i as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < original / high {
                    1.0
                } else if wavelen > original / low {
                    self.factor
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

/// The Llama 3 scaling whose factors `rope_freqs.weight` holds, if the file has that tensor:
/// the largest factor is the scaling's, the others must be what Meta's releases' constants
/// give with it (to float32 rounding, which the converter computes in); any other table is
/// refused, naming what was expected.
pub(super) fn llama3_rope(
    file: &GgufFile,
    hp: &Hyperparameters,
) -> Result<Option<Llama3Rope>, ImportError> {
    if file.tensor("rope_freqs.weight").is_none() {
        return Ok(None);
    }
    let stored = file.dequantize("rope_freqs.weight")?;
    let dim = hp.rope_dimensions.unwrap_or(hp.head_dim);
    if stored.len() * 2 != dim {
        return Err(ImportError::Inconsistent(format!(
            "rope_freqs.weight has {} factors for heads rotating {dim} features (one per pair)",
            stored.len()
        )));
    }
    let factor = stored.iter().copied().fold(f32::MIN, f32::max) as f64;
    let rope = Llama3Rope::meta(factor);
    let expected = rope.factors(hp.rope_theta, dim);
    let close = |(e, s): (&f64, &f32)| (e - *s as f64).abs() <= 1e-4 * e.abs().max(1.0);
    match expected.iter().zip(&stored).all(close) {
        true => Ok(Some(rope)),
        false => Err(ImportError::Inconsistent(format!(
            "rope_freqs.weight holds RoPE factors {stored:?}, not Llama 3's scaling (factor \
             {factor}, low_freq_factor 1, high_freq_factor 4, original context 8192: \
             {expected:?}); no other scaling is supported"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_blend_between_the_two_wavelengths() {
        // Llama 3.2 1B: head_dim 64, base 500000, factor 32.
        let f = Llama3Rope::meta(32.0).factors(500_000.0, 64);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0, "the highest frequency is kept");
        assert_eq!(f[31], 32.0, "the lowest is divided by the factor");
        let blended: Vec<_> = f.iter().filter(|&&x| x > 1.0 && x < 32.0).collect();
        assert!(!blended.is_empty(), "{f:?}");
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    }
}
