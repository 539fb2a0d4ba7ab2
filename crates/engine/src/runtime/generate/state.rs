//! One sequence's model-side state: its caches, sampler, penalty history, constraint and
//! position; a forward pass, sampling, reading a token.

use std::rc::Rc;

use mlx_rs::{ops, transforms, Array};

use super::{
    context::{GenerationContext, Result},
    guided::Guided,
    output::Output,
};
use crate::{
    layers::kv_cache::Caches,
    layers::kv_cache::{KvCache, Snapshot},
    layers::mrope::MropePositions,
    layers::row,
    models::{Input, Tap},
    runtime::prompt::PromptEmbeds,
    runtime::prompt_cache::DraftCaches,
    runtime::request::{Delta, FinishReason},
    runtime::sampler::{log_softmax, Sampler},
};

/// One step's outputs, still lazy: the sampled token `(1,)` and the log-probabilities `(1, V)`.
pub(super) struct Step {
    pub(super) token: Array,
    pub(super) logprobs: Array,
}

/// Prompt positions between a hybrid model's snapshots of a long prompt's recurrent states
/// (besides the one where the prompt ends).
const SNAPSHOT_EVERY: usize = 4096;

/// Most snapshots a sequence (and so a prompt-cache entry) keeps: the newest.
const MAX_SNAPSHOTS: usize = 8;

/// One sequence's model-side state (mlx-lm's `generate_step` locals).
pub(super) struct SequenceState<'a> {
    pub(super) ctx: Rc<GenerationContext<'a>>,
    pub(super) caches: Vec<KvCache>,
    /// A hybrid model's recurrent states at earlier positions, for the prompt cache (kept
    /// only when the caches will be: `snapshotting`).
    pub(super) snapshots: Vec<Snapshot>,
    pub(super) snapshotting: bool,
    pub(super) sampler: Sampler,
    /// The last tokens (prompt included), for the penalties; `None` when none are active.
    pub(super) recent: Option<Array>,
    /// Every token sampled so far, in order (each is fed back as the next step's input).
    pub(super) sampled: Vec<u32>,
    /// The prompt's rotary positions, when the model takes them explicitly (M-RoPE).
    pub(super) positions: Option<MropePositions>,
    /// The index in the sequence of the next token run through the model.
    pub(super) next: usize,
    /// The request's constraint, if any.
    pub(super) guide: Option<Guided>,
    /// While set: the hidden states a drafter reads of every position run (the prompt's).
    pub(super) hidden: Option<HiddenSink>,
    /// A speculative generation's drafter caches: the prompt cache's (holding the positions
    /// the model's reused caches hold) until the drafter takes them, then the drafter's at
    /// its end, for the prompt cache.
    pub(super) draft: Option<DraftCaches>,
}

/// The hidden states `tap` names, of every position run from `start` on, chunk by chunk.
pub(super) struct HiddenSink {
    pub(super) tap: Tap,
    pub(super) start: usize,
    pub(super) chunks: Vec<Array>,
}

impl SequenceState<'_> {
    /// With `kv_bits`, after every forward pass (mlx-lm's `maybe_quantize_kv_cache`).
    pub(super) fn quantize_caches(&mut self) -> Result<()> {
        if let Some(bits) = self.ctx.kv_bits {
            for cache in &mut self.caches {
                cache.quantize(bits)?;
            }
        }
        Ok(())
    }

    /// Logits for `tokens` `(L,)`, or their input embeddings `(1, L, D)` when images are
    /// merged into them, at the next positions of the sequence.
    pub(super) fn forward(
        &mut self,
        tokens: &Array,
        embeds: Option<PromptEmbeds>,
    ) -> Result<Array> {
        let tap = self.hidden.as_ref().map(|sink| sink.tap.clone());
        let (logits, hidden) = self.run(tokens, embeds, tap.as_ref())?;
        if let (Some(sink), Some(h)) = (&mut self.hidden, hidden) {
            sink.chunks.push(h);
        }
        Ok(logits)
    }

    /// [`Self::forward`], with the hidden states `tap` names `(1, L, _)`.
    pub(super) fn run(
        &mut self,
        tokens: &Array,
        embeds: Option<PromptEmbeds>,
        tap: Option<&Tap>,
    ) -> Result<(Array, Option<Array>)> {
        let model = self.ctx.model;
        let n = tokens.dim(0) as usize;
        let tokens = tokens.reshape(&[1, -1])?;
        let positions = match &self.positions {
            Some(p) => Some(p.slice(self.next, n)?),
            None => None,
        };
        let (h, deepstack) = match (&positions, embeds) {
            (_, Some(e)) => (Some(e.h), e.deepstack),
            (Some(_), None) => (Some(model.embed(&tokens)?), Vec::new()),
            (None, None) => (None, Vec::new()),
        };
        let input = match h {
            Some(h) => Input {
                positions: positions.as_ref(),
                deepstack: &deepstack,
                ..Input::embeddings(h)
            },
            None => Input::tokens(&tokens),
        };
        let caches = Caches::One(&mut self.caches);
        let out = match tap {
            Some(tap) => model
                .forward_with_hidden(input, caches, tap)
                .map(|(l, h)| (l, Some(h)))?,
            None => (model.forward(input, caches)?, None),
        };
        self.next += n;
        Ok(out)
    }

    /// Runs `tokens` `(L,)` (or their input embeddings) through the model: the last position's
    /// logits `(1, V)`, still lazy.
    pub(super) fn logits(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<Array> {
        let logits = self.forward(tokens, embeds)?;
        self.quantize_caches()?;
        let last = logits.dim(1) - 1;
        let logits = logits.take_axis(Array::from_int(last), 1)?;
        self.remember(tokens)?;
        Ok(logits)
    }

    /// What [`Self::logits`] does after the forward pass, for row `b` of a batch's logits
    /// `(B, 1, V)` that the model computed for this sequence's `token` `(1,)`.
    pub(super) fn row_logits(&mut self, logits: &Array, b: usize, token: &Array) -> Result<Array> {
        self.next += 1;
        self.quantize_caches()?;
        let logits = row(logits, b).take_axis(Array::from_int(0), 1)?;
        self.remember(token)?;
        Ok(logits)
    }

    /// Runs a prefill chunk `tokens` `(L,)` (or its input embeddings) into the caches, evaluated,
    /// and frees MLX's buffer cache after it.
    pub(super) fn prefill_chunk(
        &mut self,
        tokens: &Array,
        embeds: Option<PromptEmbeds>,
    ) -> Result<()> {
        self.forward(tokens, embeds)?;
        self.quantize_caches()?;
        transforms::eval(self.caches.iter().flat_map(KvCache::arrays))?;
        mlx_rs::memory::clear_cache()?;
        let before = self.next - tokens.dim(0) as usize;
        if before / SNAPSHOT_EVERY < self.next / SNAPSHOT_EVERY {
            self.snapshot()?;
        }
        Ok(())
    }

    /// Keeps a hybrid model's recurrent states as they are now (once per position, the
    /// newest [`MAX_SNAPSHOTS`]), when its caches will be kept.
    pub(super) fn snapshot(&mut self) -> Result<()> {
        let taken = self
            .snapshots
            .last()
            .is_some_and(|s| s.positions == self.next);
        if !self.snapshotting || taken {
            return Ok(());
        }
        if let Some(snapshot) = Snapshot::of(&self.caches, self.next)? {
            if self.snapshots.len() == MAX_SNAPSHOTS {
                self.snapshots.remove(0);
            }
            self.snapshots.push(snapshot);
        }
        Ok(())
    }

    /// The caches, their snapshots and the drafter's caches, for the prompt cache.
    pub(super) fn take_caches(&mut self) -> (Vec<KvCache>, Vec<Snapshot>, Option<DraftCaches>) {
        let caches = std::mem::take(&mut self.caches);
        (
            caches,
            std::mem::take(&mut self.snapshots),
            self.draft.take(),
        )
    }

    /// Appends `tokens` `(L,)` to the penalties' history, when they keep one.
    pub(super) fn remember(&mut self, tokens: &Array) -> Result<()> {
        if let Some(recent) = &self.recent {
            let window = self.sampler.history_window() as i32;
            let joined = ops::concatenate(&[recent, tokens], 0)?;
            let n = joined.dim(0);
            self.recent = Some(if n > window {
                joined.take_axis(ops::arange::<_, i32>(n - window, n, 1)?, 0)?
            } else {
                joined
            });
        }
        Ok(())
    }

    /// Samples from `logits`; with a constraint's `mask` (`(1, V)` booleans) only allowed
    /// tokens can come, before any other processor sees the logits.
    pub(super) fn sample(&mut self, logits: Array, mask: Option<Array>) -> Result<Step> {
        let logits = match mask {
            Some(mask) => {
                let never = Array::from_f32(f32::NEG_INFINITY).as_dtype(logits.dtype())?;
                ops::select(&mask, &logits, never)?
            }
            None => logits,
        };
        let logits = self.sampler.process(logits, self.recent.as_ref())?;
        let logprobs = log_softmax(&logits)?;
        let token = self.sampler.sample(&logprobs)?;
        Ok(Step { token, logprobs })
    }

    /// Runs `tokens` through the model and samples from the last position; with a guide, its
    /// mask (computed on the host while the forward pass runs) restricts the choice.
    pub(super) fn step(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<Step> {
        let logits = self.logits(tokens, embeds)?;
        self.choose(logits)
    }

    /// Samples from `logits` `(1, V)`, the last position's, through the guide's mask if any.
    pub(super) fn choose(&mut self, logits: Array) -> Result<Step> {
        let mask = match &mut self.guide {
            Some(guide) => {
                transforms::async_eval([&logits])?;
                Some(guide.mask()?)
            }
            None => None,
        };
        self.sample(logits, mask)
    }

    /// Reads `step`'s token and streams it; the finish reason when it ends the generation.
    pub(super) fn take(
        &mut self,
        step: &Step,
        out: &mut Output<'_>,
        on_delta: &mut dyn FnMut(Delta),
    ) -> Result<Option<FinishReason>> {
        let id = step.token.try_item_exact::<u32>()?;
        self.sampled.push(id);
        if self.ctx.eos.contains(&id) {
            return Ok(Some(FinishReason::Stop));
        }
        let complete = match self.guide.as_mut() {
            Some(guide) => guide.advance(id)?,
            None => false,
        };
        if out.push(id, &step.logprobs, on_delta)? {
            return Ok(Some(FinishReason::StopSequence));
        }
        Ok(complete.then_some(FinishReason::Stop))
    }
}

impl SequenceState<'_> {
    /// Queues what follows `logits` (see `steps.rs`'s `queue_next`).
    pub(super) fn queue(&mut self, logits: Array) -> Result<Next> {
        if self.guide.is_some() {
            transforms::async_eval([&logits])?;
            return Ok(Next::Logits(logits));
        }
        let next = self.sample(logits, None)?;
        transforms::async_eval([&next.token, &next.logprobs])?;
        Ok(Next::Step(next))
    }
}

/// What is queued ahead of the token being read: a whole step, or (constrained) its logits.
pub(super) enum Next {
    Step(Step),
    Logits(Array),
}
