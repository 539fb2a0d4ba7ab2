//! One file per architecture, all the same shape (mlx-lm's habit): `Args` read from
//! config.json, `Attention`, `Mlp`, `Block`, `Model`, and `sanitize` for checkpoint quirks.
//! Shared layers live in `crate::nn`.

mod llama;

use mlx_rs::Array;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    kv_cache::KvCache,
    nn::{Linear, Result},
    weights::Weights,
};

/// A causal language model as the generation loop sees it.
pub trait LanguageModel {
    /// Logits `(B, L, vocab)` for token ids `(B, L)`, appending to `caches` (one per layer).
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array>;
    /// Number of attention layers (= caches needed).
    fn num_layers(&self) -> usize;
    /// Every linear layer, for quantize-on-load and parameter counts.
    fn linears_mut(&mut self) -> Vec<&mut Linear>;
    /// Context length the model was trained for, if config.json says.
    fn max_position_embeddings(&self) -> Option<usize>;
}

/// The `model_type`s this build can run, as `capabilities.architectures` lists them.
pub const ARCHITECTURES: &[&str] = &["llama"];

/// Builds the model named by config.json's `model_type` from its weights.
pub fn build(
    config: &Value,
    weights: Weights,
) -> std::result::Result<Box<dyn LanguageModel>, EngineError> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    match model_type {
        "llama" => Ok(Box::new(llama::Model::load(config, weights)?)),
        other => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "model_type `{other}` is not supported; supported: {}",
                ARCHITECTURES.join(", ")
            ),
        )),
    }
}

/// Parses a model's `Args` from config.json, naming the bad field on failure.
pub(crate) fn parse_args<T: serde::de::DeserializeOwned>(
    config: &Value,
) -> std::result::Result<T, EngineError> {
    serde_json::from_value(config.clone())
        .map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, format!("config.json: {e}")))
}
