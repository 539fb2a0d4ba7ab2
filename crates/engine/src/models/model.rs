//! What a language model is to the runtime (`LanguageModel`), and how a family reads its
//! config.json (`parse_args`).

use mlx_rs::Array;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::{
        array::Result,
        kv_cache::{KvCache, PaddedCache},
        linear::Linear,
        parallel::Placement,
    },
};

/// A causal language model as the generation loop sees it.
pub trait LanguageModel {
    /// Logits `(B, L, vocab)` for token ids `(B, L)`, appending to `caches` (one per layer).
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.forward_embeddings(self.embed(tokens)?, caches)
    }
    /// The embedding table's rows for token ids `(B, L)`: `(B, L, hidden)`, before any scaling
    /// the family applies (a vision model merges image features into these).
    fn embed(&self, tokens: &Array) -> Result<Array>;
    /// Logits for input embeddings `(B, L, hidden)` as [`LanguageModel::embed`] gives them
    /// (mlx-vlm's `inputs_embeds`): the family's embedding scale, the layers, the head.
    fn forward_embeddings(&self, h: Array, caches: &mut [KvCache]) -> Result<Array>;
    /// [`LanguageModel::forward_embeddings`] at explicit rotary positions `(3, L)` (temporal,
    /// height, width; M-RoPE, see `rope.rs`) instead of the cache's offset: Qwen-VL's language
    /// model. `deepstack[i]` `(B, L, hidden)` is added to the output of layer `i` (Qwen3-VL's
    /// deepstack: image features, zero at text tokens). Other models take no positions.
    fn forward_embeddings_at(
        &self,
        _h: Array,
        _positions: &Array,
        _deepstack: &[Array],
        _caches: &mut [KvCache],
    ) -> Result<Array> {
        Err(mlx_rs::error::Exception::custom(
            "this model takes no explicit positions",
        ))
    }
    /// One decode step of several sequences at once: token ids `(B, 1)`, row `b` appending to
    /// `caches[b]`; logits `(B, 1, vocab)`, each row what [`LanguageModel::forward`] gives that
    /// sequence alone. Only where [`LanguageModel::rows_supported`].
    fn forward_rows(&self, _tokens: &Array, _caches: &mut [&mut [KvCache]]) -> Result<Array> {
        Err(mlx_rs::error::Exception::custom(
            "this model runs one sequence at a time",
        ))
    }
    /// Whether [`LanguageModel::forward_rows`] runs this model.
    fn rows_supported(&self) -> bool {
        false
    }
    /// Prefill chunks of several sequences in one pass: `tokens` `(1, ΣL)`, sequence `s`'s
    /// `lens[s]` tokens in turn continuing `caches[s]`. Logits `(1, S, vocab)` of each
    /// sequence's last position. Only where [`LanguageModel::rows_supported`].
    fn prefill_segments(
        &self,
        _tokens: &Array,
        _lens: &[i32],
        _caches: &mut [&mut [KvCache]],
    ) -> Result<Array> {
        Err(mlx_rs::error::Exception::custom(
            "this model runs one sequence at a time",
        ))
    }
    /// [`LanguageModel::forward_rows`] with every layer's caches of the batch's rows in one
    /// padded cache: one scatter and one attention call per layer for all rows. Only where
    /// [`LanguageModel::padded_supported`].
    fn forward_padded(&self, _tokens: &Array, _cache: &mut PaddedCache) -> Result<Array> {
        Err(mlx_rs::error::Exception::custom(
            "this model's batches attend row by row",
        ))
    }
    /// Whether [`LanguageModel::forward_padded`] runs this model (with full-attention caches
    /// only: the caller checks those).
    fn padded_supported(&self) -> bool {
        false
    }
    /// Number of attention layers.
    fn num_layers(&self) -> usize;
    /// Head sizes of the layers whose KV cache `kv_bits` would quantize (full attention).
    fn quantizable_kv_head_dims(&self) -> Vec<i32>;
    /// Why `kv_bits` cannot quantize this model's KV cache whatever its head sizes (attention
    /// sinks, layers sharing another layer's keys and values), if so.
    fn kv_bits_refusal(&self) -> Option<String> {
        None
    }
    /// Fresh caches, one per layer, of the kind each layer needs.
    fn make_caches(&self) -> Vec<KvCache> {
        (0..self.num_layers()).map(|_| KvCache::default()).collect()
    }
    /// Every linear layer under its checkpoint name (`model.layers.0.self_attn.q_proj`), for
    /// quantize-on-load and LoRA adapters.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)>;
    /// Context length the model was trained for, if config.json says.
    fn max_position_embeddings(&self) -> Option<usize>;
    /// How this rank holds its part of a model split over a group, and the layers it runs.
    fn placement(&self) -> Option<(&Placement, std::ops::Range<usize>)> {
        None
    }
    /// Takes off the wire and drops the hidden state the previous rank of a pipeline sent for
    /// `tokens` `(L,)`, which this rank will not run (its prefill stopped), so that the next
    /// pass reads its own. Nothing for a model not in a pipeline.
    fn discard_stage_input(&self, _tokens: &Array) -> Result<()> {
        Ok(())
    }
    /// Whether checkpoint name `name` is in a layer another rank of a pipeline holds (an
    /// adapter's update for it is that rank's to attach).
    fn held_elsewhere(&self, _name: &str) -> bool {
        false
    }
}

/// Parses a model's `Args` from config.json, naming the bad field on failure.
pub(crate) fn parse_args<T: serde::de::DeserializeOwned>(
    config: &Value,
) -> std::result::Result<T, EngineError> {
    serde_json::from_value(config.clone())
        .map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, format!("config.json: {e}")))
}
