//! Seed-OSS: the Llama layers, with biases where the checkpoint has them (`attention_bias` on
//! q/k/v, `attention_out_bias` on o, `mlp_bias` on the MLP: picked up from its `*.bias`
//! tensors). mlx-lm's seed_oss.py reads no sliding window: every layer attends to everything.

use serde_json::Value;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    models::{
        decoder::{Decoder, LlamaArgs},
        model::parse_args,
    },
};

/// mlx-lm's seed_oss `ModelArgs` are Llama's, defaults included (`head_dim` is given).
pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: LlamaArgs = parse_args(config)?;
    args.load_uniform(weights, args.layer()?)
}
