//! DeepSeek-V3 (and what mlx-lm runs as it, Kimi K2; and GLM-4.7-Flash, whose mlx-lm file is
//! a copy with other defaults and two epsilons: [`Variant`]): multi-head latent
//! attention (`layers/mla.rs`, RoPE interleaved over `qk_rope_head_dim` features, YaRN as
//! `rope_scaling` asks, its `mscale_all_dim` correcting the score scale) and, from layer
//! `first_k_dense_replace` on (every `moe_layer_freq`-th), a mixture of experts routed as
//! GLM-4-MoE's (`moe::Routing::GroupedSigmoid`) with plain shared experts. The head is never
//! tied. Hugging Face's `kv_b_proj` is split into the per-head `embed_q` / `unembed_out` as
//! mlx-lm's `sanitize` does; the multi-token-prediction layer (`model.layers.N`, N the layer
//! count) is not used.

use mlx_rs::ops::indexing::IndexOp;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mla::{IndexerSpec, LatentPrefill, MlaSpec},
    layers::moe::{MoeSpec, Routing},
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::AttentionShape,
    models::{
        decoder::{sanitize, AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        model::{parse_args, text_config_as},
    },
};

/// mlx-lm's `ModelArgs` of the two files (their defaults: [`Variant::defaults`]).
#[derive(Debug, Deserialize)]
struct Args {
    num_hidden_layers: usize,
    num_attention_heads: i32,
    n_shared_experts: Option<i32>,
    n_routed_experts: Option<i32>,
    routed_scaling_factor: f32,
    kv_lora_rank: i32,
    q_lora_rank: Option<i32>,
    qk_rope_head_dim: i32,
    v_head_dim: i32,
    qk_nope_head_dim: i32,
    topk_method: String,
    norm_topk_prob: bool,
    n_group: i32,
    topk_group: i32,
    num_experts_per_tok: i32,
    moe_layer_freq: usize,
    first_k_dense_replace: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f32,
    rope_theta: f32,
    rope_scaling: Option<Value>,
    /// DeepSeek sparse attention's indexer (`deepseek_v32`, `glm_moe_dsa`).
    index_head_dim: Option<i32>,
    index_n_heads: Option<i32>,
    index_topk: Option<i32>,
    #[serde(default)]
    indexer_rope_interleave: bool,
}

/// Which of mlx-lm's DeepSeek-V3-shaped files a checkpoint is run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `deepseek_v3.py` (also Kimi K2's).
    DeepseekV3,
    /// `glm4_moe_lite.py` (GLM-4.7-Flash): other defaults, the latent norms at `rms_norm_eps`
    /// (not 1e-6), and the router's renormalisation adding 1e-20 to its sum.
    Glm4MoeLite,
    /// `deepseek_v32.py` (DeepSeek-V3.2): DeepSeek-V3 with sparse attention (an indexer per
    /// layer picking `index_topk` keys per query).
    DeepseekV32,
    /// `glm_moe_dsa.py` (GLM-5): `deepseek_v32.py` with every field required, RoPE from
    /// `rope_parameters` and the indexer's RoPE interleaved by default.
    GlmMoeDsa,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::DeepseekV3 => "deepseek_v3",
            Self::Glm4MoeLite => "glm4_moe_lite",
            Self::DeepseekV32 => "deepseek_v32",
            Self::GlmMoeDsa => "glm_moe_dsa",
        }
    }

    /// The file's `ModelArgs` defaults.
    fn defaults(self) -> Value {
        match self {
            Self::DeepseekV32 => {
                let mut d = Self::DeepseekV3.defaults();
                let index = json!({"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048});
                (d.as_object_mut().expect("an object"))
                    .extend(index.as_object().expect("an object").clone());
                d
            }
            Self::GlmMoeDsa => json!({"rope_scaling": null, "indexer_rope_interleave": true}),
            Self::DeepseekV3 => json!({
                "num_hidden_layers": 30, "num_attention_heads": 32, "n_shared_experts": null,
                "n_routed_experts": null, "routed_scaling_factor": 1.0, "kv_lora_rank": 512,
                "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
                "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "norm_topk_prob": true,
                "n_group": 1, "topk_group": 1, "num_experts_per_tok": 1, "moe_layer_freq": 1,
                "first_k_dense_replace": 0, "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null,
            }),
            Self::Glm4MoeLite => json!({
                "num_hidden_layers": 47, "num_attention_heads": 20, "n_shared_experts": 1,
                "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512,
                "q_lora_rank": 768, "qk_rope_head_dim": 64, "v_head_dim": 256,
                "qk_nope_head_dim": 192, "topk_method": "noaux_tc", "norm_topk_prob": true,
                "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4, "moe_layer_freq": 1,
                "first_k_dense_replace": 1, "max_position_embeddings": 202752,
                "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0, "rope_scaling": null,
            }),
        }
    }
}

pub fn load(
    config: &Value,
    mut weights: Weights,
    variant: Variant,
) -> Result<Decoder, EngineError> {
    let mut merged = variant.defaults();
    if let (Some(fields), Some(given)) = (merged.as_object_mut(), config.as_object()) {
        fields.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    // glm_moe_dsa.py: `rope_scaling = rope_parameters`, `rope_theta = rope_parameters.rope_theta`.
    if variant == Variant::GlmMoeDsa {
        let parameters = merged
            .get("rope_parameters")
            .cloned()
            .unwrap_or(Value::Null);
        merged["rope_theta"] = parameters.get("rope_theta").cloned().unwrap_or(Value::Null);
        merged["rope_scaling"] = parameters;
    }
    let args: Args = parse_args(&merged)?;
    let family = variant.name();
    let unsupported = |detail: String| {
        Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!("{family}: {detail}"),
        ))
    };
    let index = [args.index_n_heads, args.index_head_dim, args.index_topk];
    if index.iter().any(|n| n.is_some_and(|n| n < 1)) {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "config.json: {family}'s index_n_heads, index_head_dim and index_topk must be                  at least 1"
            ),
        ));
    }
    if args.topk_method != "noaux_tc" {
        return unsupported(format!(
            "topk_method `{}` is not supported (mlx-lm runs `noaux_tc` only)",
            args.topk_method
        ));
    }
    if let Some(n) = weights
        .names()
        .find(|n| n.ends_with("weight_scale_inv") || n.ends_with("weight_packed"))
    {
        return unsupported(format!(
            "FP8 or packed int4 weights (`{n}`) are not supported; convert the checkpoint with \
             `mlx_lm.convert` first"
        ));
    }
    let max_pos = Some(args.max_position_embeddings);
    let scaling = args.rope_scaling.as_ref();
    let rope = rope_from_config(
        args.qk_rope_head_dim,
        args.rope_theta,
        true,
        scaling,
        max_pos,
    )?;
    let mla = MlaSpec {
        num_heads: args.num_attention_heads,
        q_lora_rank: args.q_lora_rank,
        kv_lora_rank: args.kv_lora_rank,
        qk_nope_head_dim: args.qk_nope_head_dim,
        qk_rope_head_dim: args.qk_rope_head_dim,
        v_head_dim: args.v_head_dim,
        scale: score_scale(&args),
        norm_eps: match variant {
            Variant::Glm4MoeLite => args.rms_norm_eps,
            _ => 1e-6,
        },
        temperature: None,
        prefill: LatentPrefill::RotaryScores,
        rope: Some(rope.clone()),
        indexer: match (args.index_n_heads, args.index_head_dim, args.index_topk) {
            (Some(n_heads), Some(head_dim), Some(topk)) => Some(IndexerSpec {
                n_heads,
                head_dim,
                topk,
                rope: rope_from_config(
                    args.qk_rope_head_dim,
                    args.rope_theta,
                    args.indexer_rope_interleave,
                    scaling,
                    max_pos,
                )?,
            }),
            _ => None,
        },
    };
    let n = args.num_hidden_layers;
    let head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
    let shape = AttentionShape::new(
        args.num_attention_heads,
        args.num_attention_heads,
        head_dim,
        head_dim as f64,
    );
    let layer = LayerSpec {
        attention: AttentionKind::Latent(mla),
        ..LayerSpec::llama(args.rms_norm_eps, shape, rope)
    };
    let mut spec = DecoderSpec::uniform(layer, n, false, max_pos);
    if let Some(experts) = args.n_routed_experts {
        let routing = Routing::GroupedSigmoid {
            n_group: args.n_group,
            topk_group: args.topk_group,
            norm_topk_prob: args.norm_topk_prob,
            scaling: args.routed_scaling_factor,
            sum_epsilon: (variant == Variant::Glm4MoeLite).then_some(1e-20),
        };
        let shared = args.n_shared_experts.is_some();
        let moe = MoeSpec::deepseek(experts, args.num_experts_per_tok, routing, shared);
        let freq = args.moe_layer_freq.max(1);
        for (i, layer) in spec.layers.iter_mut().enumerate() {
            if i >= args.first_k_dense_replace && i % freq == 0 {
                layer.mlp = MlpSpec::Moe(moe.clone());
            }
        }
    }
    weights.drop_prefixed(&format!("model.layers.{n}."));
    let heads = args.num_attention_heads;
    split_kv_b(
        &mut weights,
        n,
        heads,
        args.qk_nope_head_dim,
        args.v_head_dim,
    )?;
    sanitize(&mut weights, false);
    Decoder::load(weights, spec, Llama)
}

/// Kimi K2.5's language model (`kimi_k25`, its vision tower not built, as mlx-lm's
/// `kimi_k25.py` runs it): `text_config` as a DeepSeek-V3 whatever its `model_type`.
pub fn kimi_k25_text_config(config: &Value) -> Result<Value, EngineError> {
    text_config_as(config, "kimi_k25", "deepseek_v3")
}

/// `q_head_dim^-0.5`, times `(0.1 mscale_all_dim ln(factor) + 1)^2` when `rope_scaling` gives
/// a non-zero `mscale_all_dim` and a `factor` above 1 (in f64, as mlx-lm's Python floats).
fn score_scale(args: &Args) -> f32 {
    let q_head_dim = (args.qk_nope_head_dim + args.qk_rope_head_dim) as f64;
    let mut scale = q_head_dim.powf(-0.5);
    let get = |key: &str| {
        (args.rope_scaling.as_ref())
            .and_then(|s| s.get(key))
            .and_then(Value::as_f64)
    };
    if let (Some(m), Some(factor)) = (get("mscale_all_dim").filter(|m| *m != 0.0), get("factor")) {
        if factor > 1.0 {
            let s = 0.1 * m * factor.ln() + 1.0;
            scale = scale * s * s;
        }
    }
    scale as f32
}

/// Hugging Face's `kv_b_proj` `(heads * (nope + v), rank)` of each of `layers` layers as
/// mlx-lm's per-head maps: `embed_q` `(heads, rank, nope)` and `unembed_out` `(heads, v, rank)`
/// (a layer that has them already is left alone).
pub(super) fn split_kv_b(
    weights: &mut Weights,
    layers: usize,
    heads: i32,
    nope: i32,
    v_head_dim: i32,
) -> Result<(), EngineError> {
    for i in 0..layers {
        let p = format!("model.layers.{i}.self_attn");
        split_layer_kv_b(weights, &p, heads, nope, v_head_dim)?;
    }
    Ok(())
}

fn split_layer_kv_b(
    weights: &mut Weights,
    p: &str,
    heads: i32,
    nope: i32,
    v_head_dim: i32,
) -> Result<(), EngineError> {
    let Some(kv_b) = weights.remove(&format!("{p}.kv_b_proj.weight")) else {
        return Ok(());
    };
    if weights.remove(&format!("{p}.kv_b_proj.scales")).is_some() {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "a quantized `{p}.kv_b_proj` is not supported; quantize the float \
                 checkpoint with `mlx_lm.convert` (it splits that projection first)"
            ),
        ));
    }
    let w = kv_b.reshape(&[heads, nope + v_head_dim, -1])?;
    let wk = w.index((.., ..nope, ..)).swap_axes(-1, -2)?;
    let wv = w.index((.., nope.., ..));
    weights.insert(format!("{p}.embed_q.weight"), wk);
    weights.insert(format!("{p}.unembed_out.weight"), wv);
    Ok(())
}
