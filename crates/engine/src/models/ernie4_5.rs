//! ERNIE 4.5 (`ernie4_5`) and its mixture of experts (`ernie4_5_moe`): Llama's layers with
//! traditional RoPE (plain: mlx-lm reads no `rope_scaling`) and biases on every projection when
//! `use_bias`. In the MoE, the layers from `moe_layer_start_index` to `moe_layer_end_index`, every
//! `moe_layer_interval`-th, route each token to `moe_k` of `moe_num_experts` experts
//! (`moe::Routing::Renormalised`: softmax or sigmoid of the router's logits in float32, the
//! top k renormalised by their sum, at least 1e-12) and add `shared_experts` as they are. The
//! router's `e_score_correction_bias` and the multi-token-prediction tensors (`mtp_*`) are not
//! used (mlx-lm drops them: [`UNUSED`]).

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, Llama, MlpSpec},
        model::parse_args,
    },
};

/// mlx-lm's ernie4_5 / ernie4_5_moe `ModelArgs` and their defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    /// Absent: `hidden_size / num_attention_heads`.
    head_dim: Option<i32>,
    max_position_embeddings: usize,
    rope_theta: f32,
    tie_word_embeddings: bool,
    #[serde(default)]
    moe_num_experts: i32,
    #[serde(default = "one")]
    moe_k: i32,
    /// A layer index, or (the vision-language releases) one per modality: the smallest counts.
    #[serde(default)]
    moe_layer_start_index: Value,
    /// Likewise, the largest counts; absent: the last layer.
    #[serde(default)]
    moe_layer_end_index: Value,
    #[serde(default = "one_usize")]
    moe_layer_interval: usize,
    #[serde(default)]
    moe_num_shared_experts: i32,
    #[serde(default = "softmax")]
    moe_gate_act: String,
}

fn one() -> i32 {
    1
}
fn one_usize() -> usize {
    1
}
fn softmax() -> String {
    "softmax".into()
}

/// What mlx-lm's sanitize drops, wherever it is in a tensor's name.
const UNUSED: [&str; 5] = [
    "mtp_block.",
    "mtp_linear_proj.",
    "mtp_hidden_norm.",
    "mtp_emb_norm.",
    "e_score_correction_bias",
];

/// A layer index given as a number or a list of them: the list's `pick` (min or max).
fn layer_index(v: &Value, pick: fn(Vec<usize>) -> Option<usize>) -> Option<usize> {
    match v {
        Value::Array(items) => pick(
            items
                .iter()
                .filter_map(Value::as_u64)
                .map(|n| n as usize)
                .collect(),
        ),
        other => other.as_u64().map(|n| n as usize),
    }
}

pub fn load(config: &Value, mut weights: Weights, moe: bool) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = Some(args.max_position_embeddings);
    // mlx-lm's `initialize_rope` here is given no scaling config: plain RoPE, traditional.
    c.refuse_rope_scaling(if moe { "ernie4_5_moe" } else { "ernie4_5" })?;
    let rope = c.rope(head_dim, args.rope_theta, true, max_pos)?;
    let layer = c.llama_layer(head_dim, rope);
    let n = c.num_hidden_layers;
    let mut spec = DecoderSpec::uniform(layer, n, args.tie_word_embeddings, max_pos);
    if moe {
        let sigmoid = match args.moe_gate_act.as_str() {
            "softmax" => false,
            "sigmoid" => true,
            other => {
                return Err(EngineError::load(
                    LoadErrorKind::UnsupportedArchitecture,
                    format!(
                        "ernie4_5_moe: moe_gate_act `{other}` is not supported (mlx-lm runs \
                         `softmax` and `sigmoid`)"
                    ),
                ))
            }
        };
        let routing = Routing::Renormalised { sigmoid };
        let shared = args.moe_num_shared_experts > 0;
        let experts = MoeSpec::deepseek(args.moe_num_experts, args.moe_k, routing, shared);
        let start = layer_index(&args.moe_layer_start_index, |v| v.into_iter().min()).unwrap_or(0);
        let end = layer_index(&args.moe_layer_end_index, |v| v.into_iter().max())
            .unwrap_or(n.saturating_sub(1));
        let step = args.moe_layer_interval.max(1);
        for (i, layer) in spec.layers.iter_mut().enumerate() {
            if (i + 1) % step == 0 && (start..=end).contains(&i) {
                layer.mlp = MlpSpec::Moe(experts.clone());
            }
        }
    }
    let unused: Vec<String> = weights
        .names()
        .filter(|name| UNUSED.iter().any(|u| name.contains(u)))
        .cloned()
        .collect();
    for name in unused {
        weights.remove(&name);
    }
    sanitize(&mut weights, args.tie_word_embeddings);
    Decoder::load(weights, spec, Llama)
}
