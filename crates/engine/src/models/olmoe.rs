//! OLMoE: Llama's layout with RMS norms over the whole query and key projections (all heads at
//! once) before RoPE, and a sparse mixture of experts as every layer's MLP; routing is a softmax
//! over all experts, then the top k, renormalised when `norm_topk_prob`.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    models::{
        moe::{MoeSpec, Routing},
        parse_args,
        transformer::{load_uniform, CommonArgs, Decoder, LayerSpec, MlpSpec},
    },
    nn::QkNormOver,
    weights::Weights,
};

/// mlx-lm's `ModelArgs` defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    num_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    head_dim: Option<i32>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_true() -> bool {
    true
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = args.max_position_embeddings;
    let rope = c.rope(head_dim, args.rope_theta, args.rope_traditional, max_pos)?;
    let moe = MoeSpec {
        name: "mlp",
        num_experts: args.num_experts,
        top_k: args.num_experts_per_tok,
        routing: Routing::SoftmaxNegTopK {
            norm_topk_prob: args.norm_topk_prob,
        },
        expert_names: ["gate_proj", "up_proj", "down_proj"],
    };
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Projection),
        mlp: MlpSpec::Moe(moe),
        ..c.llama_layer(head_dim, rope)
    };
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
