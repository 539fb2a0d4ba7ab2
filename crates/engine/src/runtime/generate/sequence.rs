//! A generation from request to first token: set up ([`open`]), prefilled ([`resume`]), then
//! a [`Sequence`] in flight, and its end.

use std::rc::Rc;
use std::time::Instant;

use constrain::Guide;
use mlx_rs::{transforms, Array};

use super::{
    context::{GenerationContext, Result, CLEAR_CACHE_EVERY},
    guided::Guided,
    output::{ms, Output},
    pipeline, speculative,
    state::{HiddenSink, Next, SequenceState, Step},
};
use crate::{
    runtime::prompt::PromptInputs,
    runtime::prompt_cache::{Owner, PromptCache},
    runtime::request::{Completion, Delta, FinishReason, GenerateRequest, Timings, Usage},
    runtime::sampler::Sampler,
    CancelToken, EngineError,
};

/// A generation in flight: its prompt prefilled, its next token being computed.
pub(crate) struct Sequence<'a> {
    /// The caller's name for it, given back with its result.
    pub(super) id: usize,
    pub(super) dec: SequenceState<'a>,
    pub(super) out: Output<'a>,
    pub(super) on_delta: Box<dyn FnMut(Delta) + 'a>,
    pub(super) cancel: CancelToken,
    pub(super) max_new_tokens: usize,
    /// Its prompt's cache keys and whose they are, when its caches go back to the prompt
    /// cache at the end.
    pub(super) keep: Option<(Vec<u32>, Owner)>,
    /// The step whose token is read next.
    pub(super) step: Step,
    /// Tokens read so far.
    pub(super) n: usize,
    pub(super) usage: Usage,
    pub(super) timings: Timings,
    pub(super) prefill_start: Instant,
    pub(super) decode_start: Instant,
}

/// What [`resume`] leaves: a finished generation (cancelled during prefill, or decoded
/// speculatively to its end) or one to [`advance`](super::steps::advance) (perhaps handed on
/// by speculative rounds).
#[allow(clippy::large_enum_variant)] // made once per request, moved straight into place
pub(crate) enum Started<'a> {
    Done(Completion),
    Decoding(Sequence<'a>),
}

/// A generation set up and not yet prefilled: [`open`] makes it, [`resume`] runs it on (after
/// [`together::prefill`](super::together::prefill) may have prefilled its prompt with others').
pub(crate) struct Opened<'a> {
    pub(super) dec: SequenceState<'a>,
    /// Prompt tokens the prompt cache held.
    pub(super) reused: usize,
    /// What a joint pass prefilled since, or why that pass failed.
    pub(super) prefilled: Option<std::result::Result<Prefilled, String>>,
    /// What was prefilled a chunk at a time between a batch's steps (`interleave.rs`).
    pub(super) ahead: Option<Ahead>,
    /// Its prompt's cache keys and whose they are, when its caches go back to the prompt
    /// cache at the end.
    pub(super) keep: Option<(Vec<u32>, Owner)>,
}

/// A joint pass ([`together::prefill`](super::together::prefill)) ran the rest of a prompt (after
/// the prompt cache's part): when it began and the last position's logits `(1, V)`.
pub(crate) struct Prefilled {
    pub(super) began: Instant,
    pub(super) logits: Array,
}

/// What [`Opened::prefill_ahead`] prefilled (`interleave.rs`): positions past the prompt
/// cache's, and when it began.
pub(crate) struct Ahead {
    pub(super) began: Instant,
    pub(super) done: usize,
}

/// Sets up the generation of `prompt`: its sampler, and its caches from what `cache` holds of
/// the prompt.
pub(crate) fn open<'a>(
    ctx: Rc<GenerationContext<'a>>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    cache: &mut PromptCache,
    guide: Option<(Guide, &'static str)>,
) -> Result<Opened<'a>> {
    let prompt_ids = &prompt.ids[..];
    if prompt_ids.is_empty() {
        return Err(EngineError::InvalidParams {
            field: "messages".into(),
            reason: "the prompt is empty".into(),
        });
    }
    let sampler = Sampler::new(req.sampler.clone(), ctx.vocab_size)?;
    // The penalties see the prompt too; `step` appends the tokens it is given.
    let recent = sampler.needs_history().then(|| {
        let before_last = &prompt_ids[..prompt_ids.len() - 1];
        let tail = &before_last[before_last.len().saturating_sub(sampler.history_window())..];
        Array::from_slice(tail, &[tail.len() as i32])
    });
    // With `kv_bits` a reused prefix would change the numbers (its suffix would be prefilled
    // through quantized attention, a fresh prompt is quantized after its first chunk): no reuse.
    let reuse = ctx.kv_bits.is_none();
    if !reuse {
        cache.clear();
    }
    let keys = &prompt.cache_keys;
    // What this generation leaves for later ones, if anything.
    let kept = reuse && req.persist;
    let owner = Owner {
        adapter_on: ctx.adapter_on,
        conversation: req.conversation.clone(),
    };
    let (caches, reused, snapshots, draft) =
        cache.take(keys, (&owner, !req.persist), || ctx.model.make_caches());
    let dec = SequenceState {
        ctx,
        caches,
        snapshots,
        snapshotting: kept,
        sampler,
        recent,
        sampled: Vec::new(),
        positions: prompt.positions.clone(),
        next: 0,
        guide: guide.map(|(guide, field)| Guided::new(guide, field)),
        hidden: None,
        // Held through the generation only by one that speculates.
        draft: draft.filter(|_| req.speculative.is_some()),
    };
    Ok(Opened {
        dec,
        reused,
        prefilled: None,
        ahead: None,
        keep: kept.then(|| (keys.clone(), owner)),
    })
}

/// Prefills what is left of `opened`'s prompt (from what the prompt cache held, unless a
/// joint pass ran it) and queues the first step. `id` names the sequence in what
/// [`advance`](super::steps::advance) returns.
pub(crate) fn resume<'a>(
    id: usize,
    opened: Opened<'a>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    cache: &mut PromptCache,
    mut on_delta: Box<dyn FnMut(Delta) + 'a>,
    (cancel, hand_off): (&CancelToken, &mut dyn FnMut() -> bool),
) -> Result<Started<'a>> {
    let Opened {
        mut dec,
        reused,
        prefilled,
        ahead,
        keep,
    } = opened;
    let prefilled = prefilled.transpose().map_err(EngineError::Generation)?;
    let begun = begin(
        &mut dec,
        req,
        prompt,
        (reused, prefilled, ahead),
        &mut *on_delta,
        (cancel, hand_off),
    )?;
    match begun {
        Begun::Done(completion) => {
            if let Some((keys, owner)) = &keep {
                let caches = dec.take_caches();
                cache.keep(caches, keys, &dec.sampled, owner);
            }
            Ok(Started::Done(completion))
        }
        Begun::Decoding {
            out,
            step,
            usage,
            timings,
            prefill_start,
            decoded,
        } => Ok(Started::Decoding(Sequence {
            id,
            dec,
            out,
            on_delta,
            cancel: cancel.clone(),
            max_new_tokens: req.max_new_tokens,
            keep,
            step,
            n: decoded.map_or(0, |(n, _)| n),
            usage,
            timings,
            prefill_start,
            decode_start: decoded.map_or_else(Instant::now, |(_, at)| at),
        })),
    }
}

/// What [`begin`] leaves.
#[allow(clippy::large_enum_variant)] // made once per request, taken apart at once
enum Begun<'a> {
    Done(Completion),
    Decoding {
        out: Output<'a>,
        step: Step,
        usage: Usage,
        timings: Timings,
        prefill_start: Instant,
        /// Tokens already taken by speculative rounds, and when they began.
        decoded: Option<(usize, Instant)>,
    },
}

/// Prefills the prompt from `reused` (what the prompt cache held) on, unless a joint pass
/// did, after what was prefilled `ahead`, and queues the first step; a speculative request
/// decodes here, to its end or until `hand_off` (others want the model) returns its next step.
fn begin<'a>(
    dec: &mut SequenceState<'a>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    (reused, prefilled, ahead): (usize, Option<Prefilled>, Option<Ahead>),
    on_delta: &mut dyn FnMut(Delta),
    (cancel, hand_off): (&CancelToken, &mut dyn FnMut() -> bool),
) -> Result<Begun<'a>> {
    let ctx = dec.ctx.clone();
    let prompt_ids = &prompt.ids[..];
    let (done, prefill_start, first) = match (prefilled, ahead) {
        (Some(p), _) => (prompt_ids.len() - reused, p.began, Some(p.logits)),
        (None, Some(a)) => (a.done, a.began, None),
        (None, None) => (0, Instant::now(), None),
    };
    dec.next = reused + done;
    // A multi-token-prediction head and a block drafter start from the prompt's hidden states.
    if let Some(tap) = req
        .speculative
        .and_then(|s| speculative::reads(s.method, &ctx))
    {
        dec.hidden = Some(HiddenSink {
            tap,
            start: dec.next,
            chunks: Vec::new(),
        });
    }
    let mut out = Output::new(
        ctx.tokenizer.detokenizer(),
        &req.stop,
        req.logprobs,
        ctx.tokenizer,
        ctx.markup.clone(),
    );
    let mut usage = Usage {
        prompt_tokens: prompt_ids.len(),
        cached_tokens: reused,
        ..Usage::default()
    };
    let cancelled = move |out: Output<'_>| {
        let done = out.finish(FinishReason::Cancelled, usage, Timings::default());
        Ok(Begun::Done(done))
    };

    // A joint pass's positions (chunks prefilled ahead were checked one by one, and a cancel
    // after them is answered as a cancel below).
    if first.is_some() {
        ctx.check_headroom(reused + done)?;
    }
    // With images: the input embeddings of the rest of the prompt, image features merged in
    // (the encoder runs here, once per image still to prefill).
    let mut embeds = match (ctx.vision, &prompt.images) {
        (Some(vision), Some(_)) => {
            if ctx.cancelled(cancel)? {
                return cancelled(out);
            }
            let mut kept = ctx.image_features.borrow_mut();
            let (embeds, cached_images) = crate::runtime::prompt::merged_embeddings(
                ctx.model,
                vision,
                prompt,
                reused,
                (&mut kept, req.persist),
            )?;
            usage.cached_images = cached_images;
            Some(embeds)
        }
        _ => None,
    };
    // Prefill: all but the last prompt token, in chunks, checking for cancellation between them
    // (a pipeline's stages pass their chunks on as they go: `generate/pipeline.rs`).
    let mut rest = &prompt_ids[reused + done..];
    if let Some(stage) = ctx.pipeline_stage() {
        let chunks: Vec<&[u32]> = rest[..rest.len() - 1].chunks(ctx.prefill_chunk).collect();
        if pipeline::prefill(dec, stage, &chunks, reused, cancel)? {
            return cancelled(out);
        }
        rest = &rest[rest.len() - 1..];
    }
    while rest.len() > 1 {
        if ctx.cancelled(cancel)? {
            return cancelled(out);
        }
        let n = ctx.prefill_chunk.min(rest.len() - 1);
        let chunk = Array::from_slice(&rest[..n], &[n as i32]);
        let chunk_embeds = embeds.take().map(|e| {
            let (chunk, later) = e.split_at(n as i32);
            embeds = Some(later);
            chunk
        });
        dec.prefill_chunk(&chunk, chunk_embeds)?;
        rest = &rest[n..];
        ctx.check_headroom(prompt_ids.len() - rest.len())?;
    }
    // Where the prompt (a conversation's last message) ends: a hybrid model's next prompt
    // that leaves this one's answer resumes here.
    dec.snapshot()?;

    let mut timings = Timings {
        prompt_n: prompt_ids.len() - reused,
        ..Timings::default()
    };
    let step = match first {
        // The joint pass ran the last prompt token too.
        Some(logits) => {
            dec.remember(&Array::from_slice(
                &prompt_ids[prompt_ids.len() - 1..],
                &[1],
            ))?;
            dec.choose(logits)?
        }
        None => dec.step(&Array::from_slice(rest, &[rest.len() as i32]), embeds)?,
    };
    transforms::async_eval([&step.token, &step.logprobs])?;
    let drafter = match req.speculative {
        Some(spec) => speculative::Drafter::new(dec, spec, prompt_ids, cancel)?,
        None => None,
    };
    let (step, decoded) = match drafter {
        None => (step, None),
        Some(mut drafter) => {
            step.token.eval()?;
            timings.prompt_ms = ms(prefill_start);
            timings.ttft_ms = ms(ctx.started);
            let decode_start = Instant::now();
            let decoded = (speculative::decode)(
                dec,
                req,
                &mut drafter,
                step,
                &mut out,
                on_delta,
                (cancel, hand_off),
            )?;
            (usage.drafted_tokens, usage.accepted_tokens) = (drafter.drafted, drafter.accepted);
            usage.draft_cached_tokens = drafter.reused;
            match decoded {
                speculative::Decoded::HandedOff(step, n) => (step, Some((n, decode_start))),
                speculative::Decoded::Finished(finish, n) => {
                    // The drafter's caches go to the prompt cache with the model's.
                    if dec.snapshotting {
                        dec.draft = drafter.into_caches();
                    }
                    crate::layers::device::synchronize()?;
                    timings.predicted_n = out.ids.len();
                    timings.predicted_ms = if n > 0 { ms(decode_start) } else { 0.0 };
                    usage.completion_tokens = out.ids.len();
                    let done = out.finish_with(finish, usage, timings, on_delta);
                    return Ok(Begun::Done(done));
                }
            }
        }
    };
    Ok(Begun::Decoding {
        out,
        step,
        usage,
        timings,
        prefill_start,
        decoded,
    })
}

impl Sequence<'_> {
    /// The positions its cache holds now, and at most by its end.
    pub(crate) fn positions(&self) -> (usize, usize) {
        let prompt = self.usage.prompt_tokens;
        (prompt + self.n, prompt + self.max_new_tokens)
    }

    /// Reads this step's token and streams it; the finish reason when the generation ends
    /// here. `next` is step n+1, queued unless cancelled or at `max_new_tokens`.
    pub(super) fn take_step(
        &mut self,
        cancelled: bool,
        next: Option<Result<Next>>,
    ) -> Result<Option<FinishReason>> {
        let next = next.transpose()?;
        if self.n == 0 {
            self.step.token.eval()?;
            self.timings.prompt_ms = ms(self.prefill_start);
            self.timings.ttft_ms = ms(self.dec.ctx.started);
            self.decode_start = Instant::now();
        }
        if cancelled {
            return Ok(Some(FinishReason::Cancelled));
        }
        if self.n == self.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        if let Some(finish) = self
            .dec
            .take(&self.step, &mut self.out, &mut *self.on_delta)?
        {
            return Ok(Some(finish));
        }
        self.n += 1;
        if self.n.is_multiple_of(CLEAR_CACHE_EVERY) {
            mlx_rs::memory::clear_cache()?;
            let ctx = self.dec.ctx.clone();
            ctx.check_headroom(self.usage.prompt_tokens + self.n)?;
        }
        self.step = match next.expect("queued while n < max_new_tokens") {
            Next::Step(next) => next,
            Next::Logits(logits) => {
                let mask = self.dec.guide.as_mut().map(Guided::mask).transpose()?;
                let next = self.dec.sample(logits, mask)?;
                transforms::async_eval([&next.token, &next.logprobs])?;
                next
            }
        };
        Ok(None)
    }

    /// Ends the generation with `finish`: the held-back text, usage and timings; its caches
    /// go back to `cache`.
    pub(super) fn finish(
        mut self,
        finish: FinishReason,
        cache: &mut PromptCache,
    ) -> Result<Completion> {
        // A step queued ahead (before EOS or a stop string was seen) may still be running, and
        // an error MLX's stream thread met there is still held: it fails this generation, not
        // the next.
        crate::layers::device::synchronize()?;
        let mut timings = self.timings;
        timings.predicted_n = self.out.ids.len();
        timings.predicted_ms = if self.n > 0 {
            ms(self.decode_start)
        } else {
            0.0
        };
        let usage = Usage {
            completion_tokens: self.out.ids.len(),
            ..self.usage
        };
        let completion = self
            .out
            .finish_with(finish, usage, timings, &mut *self.on_delta);
        if let Some((keys, owner)) = &self.keep {
            let caches = self.dec.take_caches();
            cache.keep(caches, keys, &self.dec.sampled, owner);
        }
        Ok(completion)
    }
}
