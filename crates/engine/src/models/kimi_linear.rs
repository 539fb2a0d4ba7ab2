//! Kimi Linear (`kimi_linear`, mlx-lm's `kimi_linear.py`): the layers `linear_attn_config`
//! lists in `kda_layers` (counted from 1) are Kimi Delta Attention (`layers/kimi_delta.rs`); the
//! others multi-head latent attention (`layers/mla.rs`) without positional encoding (queries by
//! one `q_proj`, the rotary features unrotated). From layer `first_k_dense_replace` on (every
//! `moe_layer_freq`-th) the MLP is a mixture of experts routed as DeepSeek's, in the router's
//! dtype ([`Routing::KimiGrouped`]), with plain shared experts. Hugging Face's layout
//! (`block_sparse_moe` with per-expert `w1`/`w3`/`w2`, `kv_b_proj`, `q_conv1d`) is renamed and
//! split as mlx-lm's `sanitize` does; the multi-token-prediction tensors (`model.mtp*`) are not
//! used.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kimi_delta::KdaSpec,
    layers::mla::{LatentPrefill, MlaSpec},
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    layers::{Activation, AttentionShape},
    models::{
        decoder::{
            sanitize, AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec, NormLayout,
        },
        deepseek_v3::split_kv_b,
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` (the fields it reads, its defaults).
#[derive(Debug, Deserialize)]
struct Args {
    num_hidden_layers: usize,
    num_attention_heads: i32,
    head_dim: i32,
    rms_norm_eps: f32,
    linear_attn_config: LinearAttnConfig,
    model_max_length: usize,
    num_experts: i32,
    kv_lora_rank: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    qk_nope_head_dim: Option<i32>,
    qk_rope_head_dim: Option<i32>,
    v_head_dim: Option<i32>,
    #[serde(default = "one")]
    num_experts_per_token: i32,
    #[serde(default)]
    num_shared_experts: i32,
    #[serde(default = "sigmoid")]
    moe_router_activation_func: String,
    #[serde(default = "yes")]
    moe_renormalize: bool,
    #[serde(default = "one_f32")]
    routed_scaling_factor: f32,
    #[serde(default)]
    first_k_dense_replace: usize,
    #[serde(default = "one_usize")]
    moe_layer_freq: usize,
    #[serde(default = "one")]
    num_expert_group: i32,
    #[serde(default = "one")]
    topk_group: i32,
}

#[derive(Debug, Deserialize)]
struct LinearAttnConfig {
    kda_layers: Vec<usize>,
    num_heads: i32,
    head_dim: i32,
    #[serde(default = "four")]
    short_conv_kernel_size: i32,
}

fn one() -> i32 {
    1
}
fn one_usize() -> usize {
    1
}
fn one_f32() -> f32 {
    1.0
}
fn four() -> i32 {
    4
}
fn yes() -> bool {
    true
}
fn sigmoid() -> String {
    "sigmoid".into()
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let invalid = |what: String| EngineError::load(LoadErrorKind::InvalidWeights, what);
    let softmax = match args.moe_router_activation_func.as_str() {
        "sigmoid" => false,
        "softmax" => true,
        other => {
            return Err(invalid(format!(
                "config.json: moe_router_activation_func `{other}` is not one mlx-lm runs \
                 (sigmoid or softmax)"
            )))
        }
    };
    let n = args.num_hidden_layers;
    let kda = &args.linear_attn_config;
    if let Some(&bad) = kda.kda_layers.iter().find(|&&l| l == 0 || l > n) {
        return Err(invalid(format!(
            "config.json: kda_layers names layer {bad}, but they count from 1 to {n}"
        )));
    }
    // mlx-lm: `qk_nope_head_dim or head_dim`: 0 counts as absent.
    let given = |n: Option<i32>| n.filter(|&n| n != 0);
    let nope = given(args.qk_nope_head_dim).unwrap_or(args.head_dim);
    let rotary = args.qk_rope_head_dim.unwrap_or(0);
    let v_head_dim = given(args.v_head_dim).unwrap_or(args.head_dim);
    let q_head_dim = nope + rotary;
    let mla = MlaSpec {
        num_heads: args.num_attention_heads,
        q_lora_rank: None,
        kv_lora_rank: args.kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rotary,
        v_head_dim,
        scale: (q_head_dim as f64).powf(-0.5) as f32,
        rope: None,
        norm_eps: args.rms_norm_eps,
        temperature: None,
        prefill: LatentPrefill::RotaryScores,
        indexer: None,
    };
    let delta = KdaSpec {
        num_heads: kda.num_heads,
        head_dim: kda.head_dim,
        conv_kernel: kda.short_conv_kernel_size,
        rms_norm_eps: args.rms_norm_eps,
    };
    let routing = Routing::KimiGrouped {
        softmax,
        n_group: args.num_expert_group,
        topk_group: args.topk_group,
        norm_topk_prob: args.moe_renormalize,
        scaling: args.routed_scaling_factor,
    };
    let moe = MoeSpec {
        expert_names: ["w1", "w3", "w2"],
        ..MoeSpec::deepseek(
            args.num_experts,
            args.num_experts_per_token,
            routing,
            args.num_shared_experts > 0,
        )
    };
    let heads = args.num_attention_heads;
    let shape = AttentionShape::new(heads, heads, q_head_dim, q_head_dim as f64);
    let (freq, eps) = (args.moe_layer_freq.max(1), args.rms_norm_eps);
    let layers = (0..n)
        .map(|i| {
            let attention = match kda.kda_layers.contains(&(i + 1)) {
                true => AttentionKind::KimiDelta(delta.clone()),
                false => AttentionKind::Latent(mla.clone()),
            };
            let mlp = match args.num_experts > 0 && i >= args.first_k_dense_replace && i % freq == 0
            {
                true => MlpSpec::Moe(moe.clone()),
                false => MlpSpec::Dense,
            };
            // Pre-norm blocks; neither mixer reads the layer's RoPE (there is none).
            let layer = LayerSpec::single(eps, shape.clone(), attention, mlp, Activation::Silu);
            LayerSpec {
                norms: NormLayout::PreNorm,
                ..layer
            }
        })
        .collect();
    weights.drop_prefixed("model.mtp");
    sanitize_moe(&mut weights, n);
    split_kv_b(&mut weights, n, heads, nope, v_head_dim)?;
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: args.rms_norm_eps,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: Some(args.model_max_length),
    };
    Decoder::load(weights, spec, Llama)
}

/// mlx-lm's sanitize of the experts: Hugging Face's `block_sparse_moe` is the layer's `mlp`
/// (its per-expert `w1`/`w3`/`w2` stacked at load), the router's correction bias the layer's.
fn sanitize_moe(weights: &mut Weights, layers: usize) {
    weights.sanitize_parts(&[("block_sparse_moe", "mlp")]);
    for i in 0..layers {
        let p = format!("model.layers.{i}.mlp");
        if let Some(bias) = weights.remove(&format!("{p}.gate.e_score_correction_bias")) {
            weights.insert(format!("{p}.e_score_correction_bias"), bias);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    /// What loading a tiny Kimi Linear config (no tensors) with `fields` over it says.
    fn refusal(fields: Value) -> String {
        let mut config = json!({
            "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16,
            "rms_norm_eps": 1e-5, "model_max_length": 4096, "num_experts": 4,
            "kv_lora_rank": 32, "num_experts_per_token": 2,
            "linear_attn_config": {"kda_layers": [1, 2, 4], "num_heads": 4, "head_dim": 16},
        });
        let fields = fields.as_object().unwrap().clone();
        config.as_object_mut().unwrap().extend(fields);
        let weights = Weights::from_tensors(HashMap::new(), &config);
        match load(&config, weights) {
            Ok(_) => panic!("loaded without tensors"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn layers_and_routers_it_cannot_run_are_refused_by_name() {
        let kda = |layers: Value| json!({"linear_attn_config": {"kda_layers": layers, "num_heads": 4, "head_dim": 16}});
        let zero = refusal(kda(json!([0, 1])));
        assert!(
            zero.contains("names layer 0") && zero.contains("from 1 to 4"),
            "{zero}"
        );
        let past = refusal(kda(json!([1, 5])));
        assert!(past.contains("names layer 5"), "{past}");
        let router = refusal(json!({"moe_router_activation_func": "relu"}));
        assert!(
            router.contains("`relu`") && router.contains("sigmoid or softmax"),
            "{router}"
        );
        // A config it can run gets as far as the weights.
        let missing = refusal(json!({}));
        assert!(missing.contains("has no tensor"), "{missing}");
    }
}
