//! OLMoE: Llama's layout with RMS norms over the whole query and key projections (all heads at
//! once) before RoPE, and a sparse mixture of experts as every layer's MLP; routing is a softmax
//! over all experts, then the top k, renormalised when `norm_topk_prob`.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::moe::{MoeSpec, Routing, PROJECTIONS},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{Decoder, LayerSpec, LlamaArgs, MlpSpec},
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` defaults: Llama's, and the experts.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    llama: LlamaArgs,
    num_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    norm_topk_prob: bool,
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let routing = Routing::SoftmaxNegTopK {
        norm_topk_prob: args.norm_topk_prob,
    };
    let (experts, k) = (args.num_experts, args.num_experts_per_tok);
    let moe = MoeSpec::switch_glu("mlp", experts, k, routing, PROJECTIONS);
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Projection),
        mlp: MlpSpec::Moe(moe),
        ..args.llama.layer()?
    };
    args.llama.load_uniform(weights, layer)
}
