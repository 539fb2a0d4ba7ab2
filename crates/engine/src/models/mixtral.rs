//! Mixtral: Mistral's attention (`head_dim` = hidden / heads) with a sparse mixture of experts
//! (`block_sparse_moe`) as every layer's MLP; routing takes the top k logits, then a softmax
//! over those k. Hugging Face names the experts' projections `w1` (gate), `w3` (up), `w2` (down).

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder, LayerSpec, MlpSpec},
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_experts")]
    num_local_experts: i32,
    #[serde(default = "default_top_k")]
    num_experts_per_tok: i32,
    max_position_embeddings: Option<usize>,
}

fn default_rope_theta() -> f32 {
    1e6
}
fn default_experts() -> i32 {
    8
}
fn default_top_k() -> i32 {
    2
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let mut args: Args = parse_args(config)?;
    // mlx-lm's default when the field is absent (an explicit null means one per query head).
    if config.get("num_key_value_heads").is_none() {
        args.common.num_key_value_heads = Some(8);
    }
    let c = &args.common;
    // mlx-lm's Mixtral runs plain RoPE whatever `rope_scaling` says.
    c.refuse_rope_scaling("mixtral")?;
    let head_dim = c.default_head_dim();
    let max_pos = args.max_position_embeddings;
    let rope = c.rope(head_dim, args.rope_theta, args.rope_traditional, max_pos)?;
    let (experts, k, names) = (
        args.num_local_experts,
        args.num_experts_per_tok,
        ["w1", "w3", "w2"],
    );
    let moe = MoeSpec::switch_glu("block_sparse_moe", experts, k, Routing::TopKSoftmax, names);
    let layer = LayerSpec {
        mlp: MlpSpec::Moe(moe),
        ..c.llama_layer(head_dim, rope)
    };
    load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)
}
