//! A generation's settings and what it reads (the model, its tokenizer, the group), and the
//! prefill chunk sizes.

use std::{cell::RefCell, time::Instant};

use crate::{
    layers::distributed::Group, layers::parallel::Placement, models::Batching,
    models::LanguageModel, runtime::constrained::Markup, runtime::image_features::ImageFeatures,
    runtime::resident::Draft, vision::VisionModel, CancelToken, EngineError,
};

pub(super) type Result<T> = std::result::Result<T, EngineError>;

/// Prompt tokens evaluated per forward pass during prefill on a GPU (Metal, CUDA): mlx-lm's
/// `prefill_step_size`. Cancellation is checked between chunks.
pub(crate) const PREFILL_CHUNK_GPU: usize = 2048;

/// The same on the CPU, where a 2048-token chunk of a small model takes seconds: smaller chunks
/// keep cancel latency low. (On an H200, 512-token chunks prefilled a 1928-token prompt at
/// 0.6-0.7x mlx-lm's speed, 2048-token ones at 1.07x: docs/decisions/prefill-chunks.md.)
pub(crate) const PREFILL_CHUNK_CPU: usize = 512;

/// Decode steps between `clear_cache` calls, as mlx-lm does.
pub(super) const CLEAR_CACHE_EVERY: usize = 256;

/// A model and what generating with it needs.
pub(crate) struct GenerationContext<'a> {
    pub model: &'a dyn LanguageModel,
    /// The drafter for speculative decoding, if one was loaded.
    pub draft: Option<&'a Draft>,
    /// The vision side, for a vision-language model.
    pub vision: Option<&'a dyn VisionModel>,
    /// Its encoder's outputs kept by image.
    pub image_features: &'a RefCell<ImageFeatures>,
    pub tokenizer: &'a text::ModelTokenizer,
    pub eos: &'a std::collections::BTreeSet<u32>,
    pub vocab_size: usize,
    /// Quantize full-attention KV caches to this many bits (`kv_bits`).
    pub kv_bits: Option<i32>,
    /// Whether the model's adapter (if any) is on for this generation.
    pub adapter_on: bool,
    /// Prompt tokens per prefill forward pass.
    pub prefill_chunk: usize,
    /// The model's reasoning markup, if it has one.
    pub markup: Option<Markup>,
    /// When the request arrived (time to first token counts from it).
    pub started: Instant,
    /// The worker's group of ranks, which all run this generation in step.
    pub group: Option<&'a Group>,
    /// How the model's batches can run (read once per generation).
    pub batching: Batching,
}

impl<'a> GenerationContext<'a> {
    /// Whether to stop here. In a group, rank 0's answer on every rank: each rank runs the
    /// same steps, so they all ask at the same points and meet at the same collectives.
    pub fn cancelled(&self, cancel: &CancelToken) -> Result<bool> {
        match self.group {
            Some(group) => Ok(group.any(cancel.is_cancelled())?),
            None => Ok(cancel.is_cancelled()),
        }
    }

    /// This rank's share of a model split into pipeline stages, if it is one.
    pub(super) fn pipeline_stage(&self) -> Option<&'a Placement> {
        let placement = self.model.stage()?.placement;
        (placement.mode == crate::runtime::request::Parallel::Pipeline).then_some(placement)
    }

    /// [`memory::check_headroom`](crate::runtime::memory::check_headroom), agreed by every rank of
    /// a group: one rank past its limit stops them all at the same step.
    pub(super) fn check_headroom(&self, tokens: usize) -> Result<()> {
        let mine = crate::runtime::memory::check_headroom(tokens);
        let Some(group) = self.group else {
            return mine;
        };
        match (group.any(mine.is_err())?, mine) {
            (false, _) => Ok(()),
            (true, Err(e)) => Err(e),
            (true, Ok(())) => Err(EngineError::Generation(
                "another rank of the group ran past its MLX memory limit: ask for fewer tokens \
                 or split the model over more ranks"
                    .into(),
            )),
        }
    }
}
