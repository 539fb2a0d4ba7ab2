//! One file per architecture, all the same shape (mlx-lm's habit): `Args` read from
//! config.json and a `load` that maps it onto the shared decoder (`decoder/`: Block,
//! Decoder, sanitize), with the family's own computations (a `decoder::Family`, e.g.
//! Gemma 3's) in its file. Shared layers (Attention, GatedMlp, RmsNorm, Rope) live in
//! `crate::layers`; what the runtime sees of a model, in `model.rs`.

mod cohere2;
mod decoder;
mod deepseek_v3;
mod dflash;
mod dflash2;
mod dspark;
mod eagle3;
mod ernie4_5;
mod exaone4;
mod falcon_h1;
mod gemma3_text;
mod gemma3n;
mod gemma4;
mod gemma4_text;
mod glm4_moe;
mod gpt_oss;
mod granitemoehybrid;
mod kimi_linear;
mod lfm2;
mod llama;
mod llama4;
mod llama4_text;
mod mamba;
mod mamba2;
mod minimax;
mod ministral3;
mod mistral;
mod mistral3;
mod mistral4;
mod mixtral;
mod model;
mod nemotron_h;
mod olmo2;
mod olmo3;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2_5_vl_text;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;
mod qwen3_vl_text;
mod seed_oss;
mod smollm3;

pub use dflash::{BlockKind, DFlash, Proposer};
pub use eagle3::Eagle3;
pub(crate) use mistral3::text_config as mistral3_text_config;
use model::text_config_as;
pub(crate) use model::{parse_args, text_number};
pub use model::{Batching, Input, LanguageModel, Tap};

use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
};

/// The `model_type`s this build can run, as `capabilities.architectures` lists them.
pub const ARCHITECTURES: &[&str] = &[
    "cohere2",
    "deepseek_v3",
    "deepseek_v32",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone4",
    "falcon_h1",
    "falcon_mamba",
    "gemma3_text",
    "gemma3n",
    "gemma4",
    "gemma4_text",
    "glm4_moe",
    "glm4_moe_lite",
    "glm_moe_dsa",
    "gpt_oss",
    "granitemoehybrid",
    "kimi_k2",
    "kimi_k25",
    "kimi_linear",
    "lfm2",
    "lfm2_moe",
    "llama",
    "llama4",
    "llama4_text",
    "mamba",
    "mamba2",
    "minimax",
    "minimax_m2",
    "ministral3",
    "mistral",
    "mistral4",
    "mixtral",
    "nemotron_h",
    "olmo2",
    "olmo3",
    "olmoe",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_moe",
    "qwen3_next",
    "seed_oss",
    "smollm3",
];

/// Multimodal `model_type`s whose language model runs alone, as mlx-lm's text wrappers run them
/// (their towers are not built: `info.is_vision` is false and an image is refused). A
/// `mistral3` with a `vision_config` is a vision model (`vision/mistral3.rs`); without one, its
/// language model alone.
pub const TEXT_OF_MULTIMODAL: &[&str] = &[
    "gemma3n",
    "gemma4",
    "kimi_k25",
    "llama4",
    "mistral3",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_vl_moe",
];

/// Where multimodal checkpoints keep what is not the language model (Hugging Face's layout:
/// under `model.`; mlx-vlm's: at the top).
const TOWERS: &[&str] = &[
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_audio",
    "embed_vision",
    "vision_embedder",
    "vision_model",
    "mm_projector",
];

/// The language model's tensors of a multimodal checkpoint, under `model.` and `lm_head` (as
/// [`build`] expects them before sizing anything): `language_model.` (mlx-lm's and mlx-vlm's
/// layout) split off, keeping its path for per-layer quantization (with a `mtp.*` head beside
/// it), or Hugging Face's `model.language_model.` renamed and the towers ([`TOWERS`]) dropped.
fn language_model(mut weights: Weights) -> Weights {
    if weights.names().any(|n| n.starts_with("language_model.")) {
        let placement = weights.take_placement();
        let mut language = weights.split_off("language_model.");
        language.set_placement(placement);
        // A multi-token-prediction head stored beside it (Hugging Face's `mtp.*`) is its own.
        let head: Vec<String> = (weights.names())
            .filter(|n| n.starts_with("mtp."))
            .cloned()
            .collect();
        for name in head {
            let tensor = weights.remove(&name).expect("listed above");
            language.insert(name, tensor);
        }
        return language;
    }
    weights.rename_prefix("model.language_model.", "model.");
    let towers: Vec<String> = weights
        .names()
        .filter(|n| {
            let rest = n.strip_prefix("model.").unwrap_or(n);
            TOWERS.iter().any(|t| rest.starts_with(t))
        })
        .cloned()
        .collect();
    for name in towers {
        weights.remove(&name);
    }
    weights
}

/// Builds the model named by config.json's `model_type` from its weights.
pub fn build(
    config: &Value,
    weights: Weights,
) -> std::result::Result<Box<dyn LanguageModel>, EngineError> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    // A multimodal checkpoint: its language model's tensors moved to `model.` first, and (for
    // the wrappers) its text config, built as the model that names.
    let (unwrapped, weights) = match model_type {
        "gemma4" => (Some(gemma4::text_config(config)?), language_model(weights)),
        "gemma3n" => (
            Some(text_config_as(config, "gemma3n", "gemma3n_text")?),
            language_model(weights),
        ),
        "mistral3" => (
            Some(mistral3::text_config(config)?),
            language_model(weights),
        ),
        "kimi_k25" => (
            Some(deepseek_v3::kimi_k25_text_config(config)?),
            language_model(weights),
        ),
        "llama4" | "qwen3_5" | "qwen3_5_moe" => (None, language_model(weights)),
        "qwen3_vl_moe" => {
            let mut weights = language_model(weights);
            qwen3_moe::split_vl_experts(&mut weights)?;
            (Some(qwen3_moe::vl_text_config(config)?), weights)
        }
        _ => (None, weights),
    };
    let config = unwrapped.as_ref().unwrap_or(config);
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    check_sizes(config, &weights)?;
    match model_type {
        // mlx-lm runs Kimi K2 as DeepSeek-V3 (`MODEL_REMAPPING`).
        "deepseek_v3" | "kimi_k2" => Ok(Box::new(deepseek_v3::load(
            config,
            weights,
            deepseek_v3::Variant::DeepseekV3,
        )?)),
        "deepseek_v32" => Ok(Box::new(deepseek_v3::load(
            config,
            weights,
            deepseek_v3::Variant::DeepseekV32,
        )?)),
        "glm_moe_dsa" => Ok(Box::new(deepseek_v3::load(
            config,
            weights,
            deepseek_v3::Variant::GlmMoeDsa,
        )?)),
        "glm4_moe_lite" => Ok(Box::new(deepseek_v3::load(
            config,
            weights,
            deepseek_v3::Variant::Glm4MoeLite,
        )?)),
        "cohere2" => Ok(Box::new(cohere2::load(config, weights)?)),
        "ernie4_5" => Ok(Box::new(ernie4_5::load(config, weights, false)?)),
        "ernie4_5_moe" => Ok(Box::new(ernie4_5::load(config, weights, true)?)),
        "exaone4" => Ok(Box::new(exaone4::load(config, weights)?)),
        "falcon_h1" => Ok(Box::new(falcon_h1::load(config, weights)?)),
        "gemma3_text" => Ok(Box::new(gemma3_text::load(config, weights)?)),
        // Only under a `gemma3n` checkpoint (mlx-lm has no gemma3n_text of its own).
        "gemma3n_text" => Ok(Box::new(gemma3n::load(config, weights)?)),
        "gemma4_text" => Ok(Box::new(gemma4_text::load(config, weights)?)),
        "glm4_moe" => Ok(Box::new(glm4_moe::load(config, weights)?)),
        "gpt_oss" => Ok(Box::new(gpt_oss::load(config, weights)?)),
        "granitemoehybrid" => Ok(Box::new(granitemoehybrid::load(config, weights)?)),
        "kimi_linear" => Ok(Box::new(kimi_linear::load(config, weights)?)),
        "lfm2" => Ok(Box::new(lfm2::load(config, weights, false)?)),
        "lfm2_moe" => Ok(Box::new(lfm2::load(config, weights, true)?)),
        "llama" => Ok(Box::new(llama::load(config, weights, "llama")?)),
        // Its own text config (`text_config`, model_type llama4_text) is read there: a
        // `llama4_text` checkpoint of its own is another file in mlx-lm.
        "llama4" => Ok(Box::new(llama4::load(config, weights)?)),
        "llama4_text" => Ok(Box::new(llama4_text::load(config, weights)?)),
        // mlx-lm runs Falcon Mamba (`falcon_mamba`) as Mamba (`MODEL_REMAPPING`).
        "mamba" | "falcon_mamba" => Ok(Box::new(mamba::load(config, weights)?)),
        "mamba2" => Ok(Box::new(mamba2::load(config, weights)?)),
        // mlx-lm runs MiniMax-M2's checkpoints (`minimax_m2`) as `minimax` (`MODEL_REMAPPING`).
        "minimax" | "minimax_m2" => Ok(Box::new(minimax::load(config, weights)?)),
        "ministral3" => Ok(Box::new(ministral3::load(config, weights)?)),
        "mistral" => Ok(Box::new(mistral::load(config, weights)?)),
        "mistral4" => Ok(Box::new(mistral4::load(config, weights)?)),
        "mixtral" => Ok(Box::new(mixtral::load(config, weights)?)),
        "nemotron_h" => Ok(Box::new(nemotron_h::load(config, weights)?)),
        "olmo2" => Ok(Box::new(olmo2::load(config, weights)?)),
        "olmo3" => Ok(Box::new(olmo3::load(config, weights)?)),
        "olmoe" => Ok(Box::new(olmoe::load(config, weights)?)),
        "phi3" => Ok(Box::new(phi3::load(config, weights)?)),
        "qwen2" => Ok(Box::new(qwen2::load(config, weights)?)),
        // Only under a Qwen2-VL/Qwen2.5-VL (`vision::split`), which gives the positions.
        "qwen2_5_vl_text" => Ok(Box::new(qwen2_5_vl_text::load(config, weights)?)),
        "qwen3" => Ok(Box::new(qwen3::load(config, weights)?)),
        // Only under a Qwen3-VL or Qwen3-VL-MoE, likewise.
        "qwen3_vl_text" => Ok(Box::new(qwen3_vl_text::load(config, weights, false)?)),
        "qwen3_vl_moe_text" => Ok(Box::new(qwen3_vl_text::load(config, weights, true)?)),
        "qwen3_5" | "qwen3_5_moe" => Ok(Box::new(qwen3_5::load(config, weights)?)),
        "qwen3_moe" => Ok(Box::new(qwen3_moe::load(config, weights)?)),
        "qwen3_next" => Ok(Box::new(qwen3_next::load(config, weights)?)),
        "seed_oss" => Ok(Box::new(seed_oss::load(config, weights)?)),
        "smollm3" => Ok(Box::new(smollm3::load(config, weights)?)),
        other => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "model_type `{other}` is not supported; supported: {}",
                ARCHITECTURES.join(", ")
            ),
        )),
    }
}

/// Refuses a config.json that asks for more layers than the checkpoint holds, or another
/// vocabulary than its embedding table's, before a family sizes anything by it (an absurd count
/// must be an error, not an allocation failure; mlx-lm refuses both by the weights' shapes).
/// config.json's sizes that must be positive where given.
const POSITIVE_SIZES: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
];

fn check_sizes(config: &Value, weights: &Weights) -> std::result::Result<(), EngineError> {
    let refuse = |what: String| {
        Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("{what}: config.json does not describe these weights"),
        ))
    };
    // Sizes a model is built from must be positive: a zero divides by zero (`hidden_size /
    // num_attention_heads`), a negative one makes shapes no array has (fuzz/checkpoint).
    for key in POSITIVE_SIZES {
        let value = config.get(*key).and_then(Value::as_i64);
        if let Some(n) = value.filter(|&n| n <= 0) {
            return refuse(format!("config.json's {key} is {n}, which no model has"));
        }
    }
    let field = |key: &str| config.get(key).and_then(Value::as_u64);
    // Nemotron-H keeps its model under `backbone.`.
    let held = ["model.layers.", "backbone.layers."].map(|p| weights.count_indexed(p));
    let held = held.into_iter().max().unwrap_or(0) as u64;
    if let Some(asked) = field("num_hidden_layers").filter(|&n| n > held) {
        return refuse(format!(
            "config.json's num_hidden_layers is {asked} but the weights hold {held} layers \
             (`model.layers.N.*`)"
        ));
    }
    let rows = weights
        .shape("model.embed_tokens.weight")
        .map(|s| s[0] as u64);
    if let (Some(vocab), Some(rows)) = (field("vocab_size"), rows) {
        if vocab != rows {
            return refuse(format!(
                "config.json's vocab_size is {vocab} but the embedding table has {rows} rows"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use mlx_rs::Array;

    use super::*;

    /// The load error for `config` with one layer's norm as its only tensor: refusals come before
    /// any other tensor is read.
    fn refusal(config: Value) -> (LoadErrorKind, String) {
        refusal_with(config, std::collections::HashMap::new())
    }

    /// [`refusal`] with `tensors` in the checkpoint too.
    pub(crate) fn refusal_with(
        config: Value,
        mut tensors: std::collections::HashMap<String, Array>,
    ) -> (LoadErrorKind, String) {
        let norm = Array::from_slice(&[1f32; 64], &[64]);
        tensors.insert("model.layers.0.input_layernorm.weight".to_string(), norm);
        let weights = Weights::from_tensors(tensors, &config);
        match build(&config, weights) {
            Err(EngineError::Load { kind, detail }) => (kind, detail),
            Err(other) => panic!("expected a load error, got {other:?}"),
            Ok(_) => panic!("expected a load error, got a model"),
        }
    }

    fn tiny(model_type: &str) -> Value {
        json!({
            "model_type": model_type,
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "rms_norm_eps": 1e-5,
        })
    }

    /// [`tiny`] with `fields` added.
    fn tiny_with(model_type: &str, fields: Value) -> Value {
        let mut config = tiny(model_type);
        let fields = fields.as_object().unwrap().clone();
        config.as_object_mut().unwrap().extend(fields);
        config
    }

    /// A tiny `gemma3n` checkpoint's config.json, its text config changed by `fields`.
    fn gemma3n_with(fields: Value) -> Value {
        let mut text = json!({
            "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "head_dim": 16,
            "rms_norm_eps": 1e-6, "num_key_value_heads": 2, "num_kv_shared_layers": 0,
            "vocab_size_per_layer_input": 12, "sliding_window": 16,
            "max_position_embeddings": 128, "rope_local_base_freq": 10000.0,
            "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
            "layer_types": ["sliding_attention", "full_attention"],
            "activation_sparsity_pattern": [0.95], "hidden_size_per_layer_input": 16,
            "altup_num_inputs": 4, "altup_coef_clip": 120.0, "altup_correct_scale": true,
            "altup_active_idx": 0,
        });
        text.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"model_type": "gemma3n", "text_config": text})
    }

    #[test]
    fn gemma3n_refuses_a_sparsity_per_layer_missing_and_a_per_layer_table_of_other_sizes() {
        let short = gemma3n_with(json!({"activation_sparsity_pattern": []}));
        let (kind, detail) = refusal(short);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("activation_sparsity_pattern"), "{detail}");
        let (_, detail) = refusal(gemma3n_with(json!({"activation_sparsity_pattern": [1.0]})));
        assert!(detail.contains("[0, 1)"), "{detail}");
        // 12 rows of 1 layer x 16 features wanted; 10 rows of 8 stored.
        let table = Array::zeros::<f32>(&[10, 8]).unwrap();
        let tensors = [("model.embed_tokens_per_layer.weight".to_string(), table)];
        let (kind, detail) = refusal_with(gemma3n_with(json!({})), tensors.into_iter().collect());
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(
            detail.contains("model.embed_tokens_per_layer is (10, 8)"),
            "{detail}"
        );
    }

    #[test]
    fn quantization_bits_mlx_cannot_hold_are_refused_at_load() {
        let config = tiny_with(
            "llama",
            json!({"quantization": {"bits": 0, "group_size": 64}}),
        );
        let zeros = |shape: &[i32]| Array::zeros::<f32>(shape).unwrap();
        let tensors = [
            ("model.embed_tokens.weight", zeros(&[8, 8])),
            ("model.embed_tokens.scales", zeros(&[8, 1])),
            ("model.embed_tokens.biases", zeros(&[8, 1])),
        ];
        let tensors = tensors
            .into_iter()
            .map(|(n, a)| (n.to_string(), a))
            .collect();
        let (kind, detail) = refusal_with(config, tensors);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("quantization bits 0"), "{detail}");
    }

    #[test]
    fn unknown_model_type_is_unsupported_and_named() {
        let (kind, detail) = refusal(tiny("rwkv7"));
        assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
        assert!(detail.contains("`rwkv7`"), "{detail}");
        assert!(
            detail.contains("qwen3"),
            "lists what is supported: {detail}"
        );
    }

    #[test]
    fn phi3_refuses_an_unknown_rope_type_by_name() {
        let mut config = tiny("phi3");
        config["rope_scaling"] = json!({"type": "yarn", "factor": 4.0, "long_factor": [1.0]});
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
        assert!(detail.contains("`yarn`"), "{detail}");
    }

    #[test]
    fn llama_refuses_unknown_layer_types_by_name() {
        let mut config = tiny("llama");
        config["layer_types"] = json!(["chunked_attention"]);
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
        assert!(detail.contains("`chunked_attention`"), "{detail}");
    }

    /// Found by fuzz/checkpoint: `num_attention_heads: 0` divided by zero building the spec.
    #[test]
    fn sizes_that_are_not_positive_are_refused_by_name() {
        for (key, value) in [
            ("num_attention_heads", 0),
            ("hidden_size", -64),
            ("head_dim", 0),
        ] {
            let mut config = tiny("llama");
            config[key] = json!(value);
            let (kind, detail) = refusal(config);
            assert_eq!(kind, LoadErrorKind::InvalidWeights);
            assert!(detail.contains(key), "{detail}");
        }
    }

    #[test]
    fn llama_sliding_layers_need_a_window() {
        let mut config = tiny("llama");
        config["layer_types"] = json!(["sliding_attention"]);
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("sliding_window"), "{detail}");
    }

    #[test]
    fn more_layers_than_the_weights_hold_is_refused_before_anything_is_sized() {
        let mut config = tiny("llama");
        config["num_hidden_layers"] = json!(1_000_000_000_u64);
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(
            detail.contains("1000000000") && detail.contains("hold 1 layers"),
            "{detail}"
        );
    }

    #[test]
    fn qwen3_next_refuses_a_zero_full_attention_interval_by_name() {
        let config = tiny_with(
            "qwen3_next",
            json!({
                "head_dim": 16, "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                "max_position_embeddings": 64, "full_attention_interval": 0,
                "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 16,
                "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 0,
                "num_experts_per_tok": 1, "decoder_sparse_step": 1, "mlp_only_layers": [],
            }),
        );
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("full_attention_interval"), "{detail}");
    }

    #[test]
    fn ernie_refuses_an_unknown_router_activation_by_name() {
        let config = tiny_with(
            "ernie4_5_moe",
            json!({
                "max_position_embeddings": 64, "rope_theta": 1e4, "tie_word_embeddings": true,
                "moe_num_experts": 4, "moe_gate_act": "relu",
            }),
        );
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
        assert!(detail.contains("`relu`"), "{detail}");
    }

    #[test]
    fn sparse_attention_refuses_an_empty_index_by_name() {
        let config = tiny_with("deepseek_v32", json!({"index_topk": 0}));
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("index_topk"), "{detail}");
    }

    #[test]
    fn lfm2_without_attention_layers_named_is_refused() {
        let fields = json!({"max_position_embeddings": 64, "norm_eps": 1e-5, "conv_L_cache": 3});
        let config = tiny_with("lfm2", fields);
        let (kind, detail) = refusal(config);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("full_attn_idxs"), "{detail}");
    }

    /// Nemotron-H's names (`backbone`, `embeddings`, `mixer`) reach the Mamba2 layer, which
    /// refuses groups that do not divide its heads before reading a tensor of its own.
    #[test]
    fn a_mamba2_layer_whose_groups_do_not_divide_its_heads_is_refused() {
        let _lock = fixtures::mlx_test_lock();
        let fields = json!({
            "num_key_value_heads": 2, "mamba_num_heads": 6, "mamba_head_dim": 16,
            "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 4,
            "layer_norm_epsilon": 1e-5, "hybrid_override_pattern": "M",
        });
        let tensor = |shape: &[i32]| Array::zeros::<f32>(shape).unwrap();
        let tensors = [
            ("backbone.embeddings.weight", tensor(&[16, 64])),
            ("backbone.layers.0.norm.weight", tensor(&[64])),
            ("backbone.norm_f.weight", tensor(&[64])),
            ("lm_head.weight", tensor(&[16, 64])),
        ];
        let tensors = tensors
            .map(|(n, t)| (n.to_owned(), t))
            .into_iter()
            .collect();
        let (kind, detail) = refusal_with(tiny_with("nemotron_h", fields), tensors);
        assert_eq!(kind, LoadErrorKind::InvalidWeights);
        assert!(detail.contains("6 Mamba2 heads in 4 groups"), "{detail}");
    }

    #[test]
    fn every_listed_architecture_is_built() {
        for arch in ARCHITECTURES {
            // Fails on the missing tensors, not on the model_type.
            let (kind, detail) = refusal(tiny(arch));
            assert_eq!(kind, LoadErrorKind::InvalidWeights, "{arch}: {detail}");
        }
    }
}
