//! Llama 4 (Scout, Maverick: `model_type` llama4) as mlx-lm's llama4.py runs it: the language
//! model of `text_config` alone (the vision tower and projector are dropped). Of every four
//! layers the first three attend within chunks of `attention_chunk_size` positions
//! (`layers::kv_cache`'s chunked cache) with traditional RoPE (as `rope_scaling` asks) and, with
//! `use_qk_norm`, queries and keys RMS-normed without a scale after RoPE; the fourth attends to
//! everything without positional encoding, its queries scaled by position
//! (`attn_temperature_tuning`: `TemperatureForm::Llama4`). Every `interleave_moe_layer_step`-th
//! MLP is a mixture of experts: one expert per token, whose input is scaled by the sigmoid of
//! its router logit (`moe::Routing::SigmoidScalesInput`), plus a shared expert; the others are
//! dense (`intermediate_size_mlp`). The checkpoint's `feed_forward` is the decoder's `mlp`
//! ([`NAMES`]); transformers' fused experts are split at load as mlx-lm's sanitize does.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec, Routing, Shared, PROJECTIONS},
    layers::weights::Weights,
    layers::{Activation, QkNormOver, QueryTemperature, TemperatureForm},
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        model::parse_args,
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// Llama 4's names for the shared decoder's parts: (Llama 4's, the decoder's).
const NAMES: [(&str, &str); 1] = [("feed_forward", "mlp")];

/// Llama 4's q/k norm epsilon (llama4.py's, whatever `rms_norm_eps` says).
const QK_NORM_EPS: f32 = 1e-6;

/// mlx-lm's llama4 `TextArgs` and their defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: Option<i32>,
    max_position_embeddings: usize,
    rope_theta: f32,
    use_qk_norm: bool,
    attention_chunk_size: i32,
    interleave_moe_layer_step: usize,
    num_local_experts: i32,
    num_experts_per_tok: i32,
    /// A number (mlx-lm's default 4) or a boolean: on when truthy.
    #[serde(default = "default_tuning")]
    attn_temperature_tuning: Value,
    #[serde(default = "default_floor_scale")]
    floor_scale: f32,
    #[serde(default = "default_attn_scale")]
    attn_scale: f32,
}

fn default_tuning() -> Value {
    Value::from(4)
}
fn default_floor_scale() -> f32 {
    8192.0
}
fn default_attn_scale() -> f32 {
    0.1
}

pub fn load(config: &Value, mut weights: Weights) -> LoadResult<Decoder> {
    let text = config.get("text_config").ok_or_else(|| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: llama4 has no `text_config`",
        )
    })?;
    let args: Args = parse_args(text)?;
    let c = &args.common;
    let invalid = |detail: String| Err(EngineError::load(LoadErrorKind::InvalidWeights, detail));
    if args.interleave_moe_layer_step == 0 || args.attention_chunk_size < 1 {
        return invalid(
            "config.json: llama4 needs a positive interleave_moe_layer_step and \
             attention_chunk_size"
                .into(),
        );
    }
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(head_dim, args.rope_theta, true, max_pos)?;
    let tuning = match &args.attn_temperature_tuning {
        Value::Bool(on) => *on,
        Value::Number(n) => n.as_f64() != Some(0.0),
        _ => false,
    };
    let temperature = QueryTemperature {
        beta: args.attn_scale,
        max_position_embeddings: args.floor_scale,
        form: TemperatureForm::Llama4,
    };
    let step = args.interleave_moe_layer_step;
    let moe = MoeSpec {
        name: "mlp",
        router: "router",
        stacked: "experts",
        activation: Activation::Silu,
        num_experts: args.num_local_experts,
        top_k: args.num_experts_per_tok,
        routing: Routing::SigmoidScalesInput,
        expert_names: PROJECTIONS,
        shared: Shared::Single,
        latent: false,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let mut layer = c.llama_layer(head_dim, rope.clone());
            // llama4.py: every fourth layer global without RoPE, whatever `no_rope_layers` says.
            if (i + 1) % 4 != 0 {
                layer.shape.chunk = Some(args.attention_chunk_size);
                layer.qk_norm = args.use_qk_norm.then_some(QkNormOver::Unscaled {
                    eps: QK_NORM_EPS,
                    after_rope: true,
                });
            } else {
                layer.rope = None;
                layer.shape.temperature = tuning.then_some(temperature);
            }
            if i % step == step - 1 {
                layer.mlp = MlpSpec::Moe(moe.clone());
            }
            layer
        })
        .collect::<Vec<LayerSpec>>();
    weights.rename_parts(&NAMES);
    split_fused_experts(&mut weights, FusedExperts::Columns, |mlp| {
        format!("{mlp}.experts")
    })?;
    sanitize(&mut weights, false);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: false,
        max_position_embeddings: max_pos,
    };
    Decoder::load(weights, spec, Llama)
}
