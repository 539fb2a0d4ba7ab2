//! What a language model is to the runtime (`LanguageModel`), and how a family reads its
//! config.json (`parse_args`).

use std::ops::Range;

use mlx_rs::Array;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::{
        array::Result,
        kv_cache::{Caches, KvCache},
        linear::Linear,
        parallel::Placement,
    },
};

/// What one forward pass reads.
pub struct Input<'a> {
    /// Token ids `(B, L)`: embedded unless `embeddings` are given; per-layer inputs (Gemma 4)
    /// come from them.
    pub tokens: Option<&'a Array>,
    /// Input embeddings `(B, L, hidden)` as [`LanguageModel::embed`] gives them, before the
    /// family's scaling (mlx-vlm's `inputs_embeds`: a vision model merges image features in).
    pub embeddings: Option<Array>,
    /// Rotary positions `(3, L)` (temporal, height, width; M-RoPE, `layers/mrope.rs`) in place
    /// of the cache's offset: Qwen-VL's language model. Other models take none.
    pub positions: Option<&'a Array>,
    /// Added to the output of layer `i` (Qwen3-VL's deepstack: image features, zero at text
    /// tokens), `(B, L, hidden)` each.
    pub deepstack: &'a [Array],
}

impl<'a> Input<'a> {
    pub fn tokens(tokens: &'a Array) -> Self {
        Self {
            tokens: Some(tokens),
            embeddings: None,
            positions: None,
            deepstack: &[],
        }
    }

    pub fn embeddings(h: Array) -> Self {
        Self {
            tokens: None,
            embeddings: Some(h),
            positions: None,
            deepstack: &[],
        }
    }
}

/// The hidden states a forward pass also returns, for a drafter that reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tap {
    /// After the final norm, before the head (a multi-token-prediction head reads them).
    Final,
    /// The outputs of these layers, joined on the last axis (a DFlash drafter's context).
    Layers(Vec<usize>),
}

/// How a model's batches can run ([`Caches`]'s kinds beyond one sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// [`Caches::Rows`] and [`Caches::Segments`].
    pub rows: bool,
    /// [`Caches::Padded`] (with full-attention caches only: the caller checks those).
    pub padded: bool,
}

/// What the runtime reads of a built model.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Layers this rank runs.
    pub layers: usize,
    /// Features of the hidden state, and rows of the embedding (token ids it embeds).
    pub hidden_size: i32,
    pub embedding_rows: i32,
    /// Context length the model was trained for, if config.json says.
    pub max_position_embeddings: Option<usize>,
    /// Head sizes of the layers whose KV cache `kv_bits` would quantize (full attention).
    pub quantizable_kv_head_dims: Vec<i32>,
    /// Why `kv_bits` cannot quantize this model's KV cache whatever its head sizes (attention
    /// sinks, layers sharing another layer's keys and values), if so.
    pub kv_bits_refusal: Option<String>,
    pub batching: Batching,
}

/// This rank's part of a model split over a group.
pub struct Stage<'a> {
    pub placement: &'a Placement,
    /// The checkpoint's layers this rank runs.
    pub layers: Range<usize>,
    /// The checkpoint's layer count.
    pub total_layers: usize,
}

impl Stage<'_> {
    /// Whether checkpoint name `name` is in a layer another rank of a pipeline holds (an
    /// adapter's update for it is that rank's to attach).
    pub fn held_elsewhere(&self, name: &str) -> bool {
        let layer = (name.strip_prefix("model.layers."))
            .and_then(|rest| rest.split('.').next())
            .and_then(|k| k.parse::<usize>().ok());
        layer.is_some_and(|k| k < self.total_layers && !self.layers.contains(&k))
    }
}

/// A causal language model as the runtime sees it: one forward over its input and a set of
/// caches whose kind decides how the pass's sequences are batched.
pub trait LanguageModel {
    /// The embedding table's rows for token ids `(B, L)`: `(B, L, hidden)`, before any scaling
    /// the family applies (a vision model merges image features into these).
    fn embed(&self, tokens: &Array) -> Result<Array>;
    /// Logits `(B, L, vocab)` for `input`, appending to `caches` (one cache per layer and
    /// sequence); with [`Caches::Segments`], `(1, S, vocab)` of each sequence's last position.
    fn forward(&self, input: Input, caches: Caches) -> Result<Array>;
    /// Fresh caches, one per layer, of the kind each layer needs.
    fn make_caches(&self) -> Vec<KvCache>;
    fn facts(&self) -> Facts;
    /// Every linear layer under its checkpoint name (`model.layers.0.self_attn.q_proj`), for
    /// quantize-on-load and LoRA adapters.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)>;
    /// How this rank holds its part of a model split over a group.
    fn stage(&self) -> Option<Stage<'_>> {
        None
    }
    /// Takes off the wire and drops the hidden state the previous rank of a pipeline sent for
    /// `tokens` `(L,)`, which this rank will not run (its prefill stopped), so that the next
    /// pass reads its own. Nothing for a model not in a pipeline.
    fn discard_stage_input(&self, _tokens: &Array) -> Result<()> {
        Ok(())
    }
    /// [`Self::forward`] of one sequence, with the hidden states `tap` names `(1, L, _)`.
    fn forward_with_hidden(
        &self,
        _input: Input,
        _caches: Caches,
        _tap: &Tap,
    ) -> Result<(Array, Array)> {
        Err(mlx_rs::error::Exception::custom(
            "this model does not give its hidden states",
        ))
    }
    /// The model's head over hidden states after its final norm `(1, L, hidden)`: logits.
    fn head_logits(&self, _hidden: &Array) -> Result<Array> {
        Err(mlx_rs::error::Exception::custom(
            "this model's head does not take outside hidden states",
        ))
    }
    /// Whether [`Self::head_logits`] is a head of its own, not the embedding's table (tied).
    fn has_lm_head(&self) -> bool {
        true
    }
    /// The layers of the checkpoint's own multi-token-prediction head; 0: none.
    fn mtp_depth(&self) -> usize {
        0
    }
    /// Fresh caches for the multi-token-prediction head's layers.
    fn mtp_caches(&self) -> Vec<KvCache> {
        Vec::new()
    }
    /// The multi-token-prediction head over `tokens` `(1, T)` beside the hidden states
    /// `(1, T, hidden)` of the positions before them: its logits `(1, T, vocab)` and its own
    /// hidden states `(1, T, hidden)`, which can stand in for the model's to chain it.
    fn mtp_forward(
        &self,
        _tokens: &Array,
        _hidden: &Array,
        _caches: &mut [KvCache],
    ) -> Result<(Array, Array)> {
        Err(mlx_rs::error::Exception::custom(
            "this model has no multi-token-prediction head",
        ))
    }
}

/// Parses a model's `Args` from config.json, naming the bad field on failure.
pub(crate) fn parse_args<T: serde::de::DeserializeOwned>(
    config: &Value,
) -> std::result::Result<T, EngineError> {
    serde_json::from_value(config.clone())
        .map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, format!("config.json: {e}")))
}

/// A number config.json gives the language model: at the top, or under `text_config`
/// (multimodal checkpoints, which often keep it only there).
pub(crate) fn text_number(config: &Value, key: &str) -> Option<u64> {
    (config[key].as_u64()).or_else(|| config["text_config"][key].as_u64())
}

/// A multimodal checkpoint's language-model config: its `text_config` object (which `outer`
/// must have), run as `model_type` whatever its own says.
pub(crate) fn text_config_as(
    config: &Value,
    outer: &str,
    model_type: &str,
) -> std::result::Result<Value, EngineError> {
    let text = config.get("text_config").filter(|t| t.is_object());
    let mut text = text.cloned().ok_or_else(|| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("config.json: {outer} needs a `text_config` object (its language model)"),
        )
    })?;
    text["model_type"] = Value::from(model_type);
    Ok(text)
}
