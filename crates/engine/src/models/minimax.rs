//! MiniMax (M2 and its successors' text model, `minimax`): Llama's layout with RMS norms over
//! the whole query and key projections (`use_qk_norm`), plain RoPE over the first `rotary_dim`
//! features of each head, and a sparse mixture of experts as every layer's MLP
//! (`block_sparse_moe`, experts `w1`/`w3`/`w2`), routed by `moe::Routing::BiasedSigmoid`.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder, LayerSpec, MlpSpec},
        model::parse_args,
    },
};

/// mlx-lm's minimax `ModelArgs` and their defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    /// Absent: `hidden_size / num_attention_heads`.
    head_dim: Option<i32>,
    max_position_embeddings: usize,
    rope_theta: f32,
    rotary_dim: i32,
    num_local_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "yes")]
    use_qk_norm: bool,
}

fn yes() -> bool {
    true
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    // mlx-lm's MiniMax runs plain RoPE whatever `rope_scaling` says.
    c.refuse_rope_scaling("minimax")?;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(args.rotary_dim, args.rope_theta, false, max_pos)?;
    let (experts, k) = (args.num_local_experts, args.num_experts_per_tok);
    let names = ["w1", "w3", "w2"];
    let moe = MoeSpec::switch_glu(
        "block_sparse_moe",
        experts,
        k,
        Routing::BiasedSigmoid,
        names,
    );
    let layer = LayerSpec {
        qk_norm: args.use_qk_norm.then_some(QkNormOver::Projection),
        mlp: MlpSpec::Moe(moe),
        ..c.llama_layer(head_dim, rope)
    };
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
