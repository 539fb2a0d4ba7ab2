//! Mistral: mlx-lm maps `model_type: mistral` to its Llama implementation, and so do we.
//!
//! `sliding_window` in a Mistral config.json is ignored there: the Llama model only windows
//! layers that `layer_types` marks `sliding_attention`, and Mistral configs have no
//! `layer_types`, so every layer attends to the whole context. Matching that is what keeps
//! greedy decoding token-exact (Mistral 7B v0.1's 4096 window only matters past 4096 tokens).

use serde_json::Value;

use crate::{error::EngineError, layers::weights::Weights, models::decoder::Decoder};

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    super::llama::load(config, weights, "mistral")
}
