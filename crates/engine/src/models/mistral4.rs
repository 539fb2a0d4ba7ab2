//! Mistral 4 (Mistral Small 4's language model): DeepSeek-V3's multi-head latent attention
//! (`layers/mla.rs`) with RoPE and YaRN from `rope_parameters`, Llama 4's query scale by
//! position on both query parts, and a prefill over the expanded keys with the rotary part
//! beside them (`LatentPrefill::Concatenated`); from layer `first_k_dense_replace` on, experts
//! chosen by softmax scores within the best groups (`moe::Routing::GroupedSoftmax`) plus plain
//! shared experts. As mlx-lm's mistral4.py.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mla::{LatentPrefill, MlaSpec},
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec, Routing},
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{AttentionShape, QueryTemperature, TemperatureForm},
    models::{
        decoder::{sanitize, AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        deepseek_v3::split_kv_b,
        model::parse_args,
    },
};

/// mlx-lm's mistral4 `ModelArgs` and its defaults.
#[derive(Debug, Deserialize)]
struct Args {
    num_hidden_layers: usize,
    num_attention_heads: i32,
    n_routed_experts: i32,
    routed_scaling_factor: f32,
    kv_lora_rank: i32,
    q_lora_rank: Option<i32>,
    norm_topk_prob: bool,
    max_position_embeddings: usize,
    rms_norm_eps: f32,
    topk_group: i32,
    num_experts_per_tok: i32,
    first_k_dense_replace: usize,
    n_group: i32,
    qk_rope_head_dim: i32,
    qk_nope_head_dim: i32,
    v_head_dim: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_interleave: Option<bool>,
    /// mlx-lm reads RoPE, YaRN and the query scale from here (`rope_theta` default 1e5).
    rope_parameters: Value,
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    if let Some(n) = weights
        .names()
        .find(|n| n.ends_with("weight_scale_inv") || n.ends_with("weight_packed"))
    {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "mistral4: FP8 or packed int4 weights (`{n}`) are not supported; convert the \
                 checkpoint with `mlx_lm.convert` first"
            ),
        ));
    }
    let params = &args.rope_parameters;
    let number = |key: &str| params.get(key).and_then(Value::as_f64);
    let required = |key: &str| {
        number(key).ok_or_else(|| {
            EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!("config.json: mistral4 needs a number `rope_parameters.{key}`"),
            )
        })
    };
    let temperature = QueryTemperature {
        beta: required("llama_4_scaling_beta")? as f32,
        max_position_embeddings: required("original_max_position_embeddings")? as f32,
        form: TemperatureForm::Mistral,
    };
    let theta = number("rope_theta").unwrap_or(100_000.0) as f32;
    let max_pos = Some(args.max_position_embeddings);
    let traditional = args.rope_interleave.unwrap_or(true);
    let rope = rope_from_config(
        args.qk_rope_head_dim,
        theta,
        traditional,
        Some(params),
        max_pos,
    )?;
    let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
    let mla = MlaSpec {
        num_heads: args.num_attention_heads,
        q_lora_rank: args.q_lora_rank,
        kv_lora_rank: args.kv_lora_rank,
        qk_nope_head_dim: args.qk_nope_head_dim,
        qk_rope_head_dim: args.qk_rope_head_dim,
        v_head_dim: args.v_head_dim,
        scale: yarn_scale((q_head_dim as f64).powf(-0.5), params) as f32,
        rope: Some(rope.clone()),
        norm_eps: 1e-6,
        temperature: Some(temperature),
        prefill: LatentPrefill::Concatenated,
        indexer: None,
    };
    let heads = args.num_attention_heads;
    let shape = AttentionShape::new(heads, heads, q_head_dim, q_head_dim as f64);
    let layer = LayerSpec {
        attention: AttentionKind::Latent(mla),
        ..LayerSpec::llama(args.rms_norm_eps, shape, rope)
    };
    let n = args.num_hidden_layers;
    let tie = args.tie_word_embeddings;
    let mut spec = DecoderSpec::uniform(layer, n, tie, max_pos);
    let routing = Routing::GroupedSoftmax {
        n_group: args.n_group,
        topk_group: args.topk_group,
        norm_topk_prob: args.norm_topk_prob,
        scaling: args.routed_scaling_factor,
    };
    let moe = MoeSpec::deepseek(
        args.n_routed_experts,
        args.num_experts_per_tok,
        routing,
        true,
    );
    for layer in spec.layers.iter_mut().skip(args.first_k_dense_replace) {
        layer.mlp = MlpSpec::Moe(moe.clone());
    }
    split_kv_b(
        &mut weights,
        n,
        heads,
        args.qk_nope_head_dim,
        args.v_head_dim,
    )?;
    // transformers' fused experts (`Mistral4NaiveMoe`), as mlx-lm's sanitize splits them.
    split_fused_experts(&mut weights, FusedExperts::Rows, |mlp| {
        format!("{mlp}.switch_mlp")
    })?;
    sanitize(&mut weights, tie);
    Decoder::load(weights, spec, Llama)
}

/// mlx-lm's `apply_yarn_mscale`: `scale * (0.1 * mscale_all_dim * ln(factor) + 1)^2` for a
/// non-default RoPE type with a non-zero `mscale_all_dim` and a `factor` above 1.
fn yarn_scale(scale: f64, params: &Value) -> f64 {
    let kind = (params.get("type").or_else(|| params.get("rope_type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number =
        |key: &str, default: f64| params.get(key).and_then(Value::as_f64).unwrap_or(default);
    let (mscale_all_dim, factor) = (number("mscale_all_dim", 0.0), number("factor", 1.0));
    if kind == "default" || mscale_all_dim == 0.0 || factor <= 1.0 {
        return scale;
    }
    let s = 0.1 * mscale_all_dim * factor.ln() + 1.0;
    scale * s * s
}
