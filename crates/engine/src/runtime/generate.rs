//! The generation loop: chunked, cancellable prefill, then decoding pipelined the way mlx-lm's
//! `generate_step` is (step n+1 is queued with `async_eval` before step n's token is read), with
//! streaming detokenization and stop-sequence holdback on the host; a constraint's token mask
//! (`constrain`) is applied before sampling.

use std::rc::Rc;
use std::time::Instant;

use constrain::Guide;
use mlx_rs::{ops, transforms, Array};
use text::{StopMatcher, StreamingDetokenizer};

use crate::{
    layers::distributed::Group,
    layers::kv_cache::{KvCache, PaddedCache},
    layers::mrope::MropePositions,
    layers::parallel::Placement,
    layers::row,
    models::LanguageModel,
    runtime::constrained::Markup,
    runtime::prompt::{PromptEmbeds, PromptInputs},
    runtime::prompt_cache::PromptCache,
    runtime::request::{
        Channel, Completion, Delta, FinishReason, GenerateRequest, Timings, TokenLogprob, Usage,
    },
    runtime::sampler::{log_softmax, Sampler},
    vision::VisionModel,
    CancelToken, EngineError,
};

/// Prompt tokens evaluated per forward pass during prefill on a GPU (Metal, CUDA): mlx-lm's
/// `prefill_step_size`. Cancellation is checked between chunks.
pub(crate) const PREFILL_CHUNK_GPU: usize = 2048;
/// The same on the CPU, where a 2048-token chunk of a small model takes seconds: smaller chunks
/// keep cancel latency low. (On an H200, 512-token chunks prefilled a 1928-token prompt at
/// 0.6-0.7x mlx-lm's speed, 2048-token ones at 1.07x: docs/decisions/prefill-chunks.md.)
pub(crate) const PREFILL_CHUNK_CPU: usize = 512;
/// Decode steps between `clear_cache` calls, as mlx-lm does.
const CLEAR_CACHE_EVERY: usize = 256;

/// A model and what generating with it needs.
pub(crate) struct GenerationContext<'a> {
    pub model: &'a dyn LanguageModel,
    /// The draft model for speculative decoding, if one was loaded.
    pub draft: Option<&'a dyn LanguageModel>,
    /// The vision side, for a vision-language model.
    pub vision: Option<&'a dyn VisionModel>,
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
    fn pipeline_stage(&self) -> Option<&'a Placement> {
        let (placement, _) = self.model.placement()?;
        (placement.mode == crate::runtime::request::Parallel::Pipeline).then_some(placement)
    }

    /// [`memory::check_headroom`](crate::runtime::memory::check_headroom), agreed by every rank of a
    /// group: one rank past its limit stops them all at the same step.
    fn check_headroom(&self, tokens: usize) -> Result<()> {
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

mod guided;
pub(crate) mod interleave;
mod padded;
mod pipeline;
mod speculative;
pub(crate) mod together;

use guided::Guided;

type Result<T> = std::result::Result<T, EngineError>;

/// One step's outputs, still lazy: the sampled token `(1,)` and the log-probabilities `(1, V)`.
struct Step {
    token: Array,
    logprobs: Array,
}

struct Decoder<'a> {
    ctx: Rc<GenerationContext<'a>>,
    caches: Vec<KvCache>,
    sampler: Sampler,
    /// The last tokens (prompt included), for the penalties; `None` when none are active.
    recent: Option<Array>,
    /// Every token sampled so far, in order (each is fed back as the next step's input).
    sampled: Vec<u32>,
    /// The prompt's rotary positions, when the model takes them explicitly (M-RoPE).
    positions: Option<MropePositions>,
    /// The index in the sequence of the next token run through the model.
    next: usize,
    /// The request's constraint, if any.
    guide: Option<Guided>,
}

impl Decoder<'_> {
    /// With `kv_bits`, after every forward pass (mlx-lm's `maybe_quantize_kv_cache`).
    fn quantize_caches(&mut self) -> Result<()> {
        if let Some(bits) = self.ctx.kv_bits {
            for cache in &mut self.caches {
                cache.quantize(bits)?;
            }
        }
        Ok(())
    }

    /// Logits for `tokens` `(L,)`, or their input embeddings `(1, L, D)` when images are
    /// merged into them, at the next positions of the sequence.
    fn forward(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<Array> {
        let model = self.ctx.model;
        let n = tokens.dim(0) as usize;
        let logits = match (&self.positions, embeds) {
            (Some(p), embeds) => {
                let (h, deepstack) = match embeds {
                    Some(e) => (e.h, e.deepstack),
                    None => (model.embed(&tokens.reshape(&[1, -1])?)?, Vec::new()),
                };
                let positions = p.slice(self.next, n)?;
                model.forward_embeddings_at(h, &positions, &deepstack, &mut self.caches)?
            }
            (None, Some(e)) => model.forward_embeddings(e.h, &mut self.caches)?,
            (None, None) => model.forward(&tokens.reshape(&[1, -1])?, &mut self.caches)?,
        };
        self.next += n;
        Ok(logits)
    }

    /// Runs `tokens` `(L,)` (or their input embeddings) through the model: the last position's
    /// logits `(1, V)`, still lazy.
    fn logits(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<Array> {
        let logits = self.forward(tokens, embeds)?;
        self.quantize_caches()?;
        let last = logits.dim(1) - 1;
        let logits = logits.take_axis(Array::from_int(last), 1)?;
        self.remember(tokens)?;
        Ok(logits)
    }

    /// What [`Self::logits`] does after the forward pass, for row `b` of a batch's logits
    /// `(B, 1, V)` that the model computed for this sequence's `token` `(1,)`.
    fn row_logits(&mut self, logits: &Array, b: usize, token: &Array) -> Result<Array> {
        self.next += 1;
        self.quantize_caches()?;
        let logits = row(logits, b).take_axis(Array::from_int(0), 1)?;
        self.remember(token)?;
        Ok(logits)
    }

    /// Runs a prefill chunk `tokens` `(L,)` (or its input embeddings) into the caches, evaluated,
    /// and frees MLX's buffer cache after it.
    fn prefill_chunk(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<()> {
        self.forward(tokens, embeds)?;
        self.quantize_caches()?;
        transforms::eval(self.caches.iter().flat_map(KvCache::arrays))?;
        mlx_rs::memory::clear_cache()?;
        Ok(())
    }

    /// Appends `tokens` `(L,)` to the penalties' history, when they keep one.
    fn remember(&mut self, tokens: &Array) -> Result<()> {
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
    fn sample(&mut self, logits: Array, mask: Option<Array>) -> Result<Step> {
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
    fn step(&mut self, tokens: &Array, embeds: Option<PromptEmbeds>) -> Result<Step> {
        let logits = self.logits(tokens, embeds)?;
        self.choose(logits)
    }

    /// Samples from `logits` `(1, V)`, the last position's, through the guide's mask if any.
    fn choose(&mut self, logits: Array) -> Result<Step> {
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
    fn take(
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

/// Generates a completion for `prompt`, calling `on_delta` with each piece of new text.
/// Starts from what `cache` holds of the prompt, and leaves this generation's caches there.
pub(crate) fn generate(
    ctx: GenerationContext<'_>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    cache: &mut PromptCache,
    guide: Option<(Guide, &'static str)>,
    on_delta: &mut dyn FnMut(Delta),
    cancel: &CancelToken,
) -> Result<Completion> {
    let on_delta = Box::new(|d: Delta| on_delta(d));
    let seq = match start(0, Rc::new(ctx), req, prompt, cache, guide, on_delta, cancel)? {
        Started::Done(completion) => return Ok(completion),
        Started::Decoding(seq) => seq,
    };
    let mut seqs = vec![seq];
    loop {
        if let Some((_, result)) = advance(&mut seqs, cache, None).pop() {
            return result;
        }
    }
}

/// A generation in flight: its prompt prefilled, its next token being computed.
pub(crate) struct Sequence<'a> {
    /// The caller's name for it, given back with its result.
    id: usize,
    dec: Decoder<'a>,
    out: Output<'a>,
    on_delta: Box<dyn FnMut(Delta) + 'a>,
    cancel: CancelToken,
    max_new_tokens: usize,
    /// Its prompt's cache keys, when its caches go back to the prompt cache at the end.
    keep: Option<Vec<u32>>,
    /// The step whose token is read next.
    step: Step,
    /// Tokens read so far.
    n: usize,
    usage: Usage,
    timings: Timings,
    prefill_start: Instant,
    decode_start: Instant,
}

/// What [`start`] leaves: a finished generation (cancelled during prefill, or decoded
/// speculatively to its end) or one to [`advance`].
#[allow(clippy::large_enum_variant)] // made once per request, moved straight into place
pub(crate) enum Started<'a> {
    Done(Completion),
    Decoding(Sequence<'a>),
}

/// Prefills `prompt` from what `cache` holds of it and queues the first step. `id` names the
/// sequence in what [`advance`] returns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start<'a>(
    id: usize,
    ctx: Rc<GenerationContext<'a>>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    cache: &mut PromptCache,
    guide: Option<(Guide, &'static str)>,
    on_delta: Box<dyn FnMut(Delta) + 'a>,
    cancel: &CancelToken,
) -> Result<Started<'a>> {
    let opened = open(ctx, req, prompt, cache, guide)?;
    resume(id, opened, req, prompt, cache, on_delta, cancel)
}

/// A generation set up and not yet prefilled: [`open`] makes it, [`resume`] runs it on
/// (after [`together::prefill`] may have prefilled its prompt with others').
pub(crate) struct Opened<'a> {
    dec: Decoder<'a>,
    /// Prompt tokens the prompt cache held.
    reused: usize,
    /// What a joint pass prefilled since, or why that pass failed.
    prefilled: Option<std::result::Result<Prefilled, String>>,
    /// What was prefilled a chunk at a time between a batch's steps ([`interleave`]).
    ahead: Option<interleave::Ahead>,
    /// Its prompt's cache keys, when its caches go back to the prompt cache at the end.
    keep: Option<Vec<u32>>,
}

/// A joint pass ([`together::prefill`]) ran the rest of a prompt (after the prompt cache's
/// part): when it began and the last position's logits `(1, V)`.
pub(crate) struct Prefilled {
    began: Instant,
    logits: Array,
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
    let (caches, reused) = cache.take(keys, ctx.adapter_on, || ctx.model.make_caches());
    let dec = Decoder {
        ctx,
        caches,
        sampler,
        recent,
        sampled: Vec::new(),
        positions: prompt.positions.clone(),
        next: 0,
        guide: guide.map(|(guide, field)| Guided::new(guide, field)),
    };
    Ok(Opened {
        dec,
        reused,
        prefilled: None,
        ahead: None,
        keep: reuse.then(|| keys.clone()),
    })
}

/// Prefills what is left of `opened`'s prompt and queues the first step (see [`start`]).
pub(crate) fn resume<'a>(
    id: usize,
    opened: Opened<'a>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    cache: &mut PromptCache,
    mut on_delta: Box<dyn FnMut(Delta) + 'a>,
    cancel: &CancelToken,
) -> Result<Started<'a>> {
    let Opened {
        mut dec,
        reused,
        prefilled,
        ahead,
        keep,
    } = opened;
    let prefilled = prefilled.transpose().map_err(EngineError::Generation)?;
    let adapter_on = dec.ctx.adapter_on;
    let begun = begin(
        &mut dec,
        req,
        prompt,
        (reused, prefilled, ahead),
        &mut *on_delta,
        cancel,
    )?;
    match begun {
        Begun::Done(completion) => {
            if let Some(keys) = &keep {
                let caches = std::mem::take(&mut dec.caches);
                cache.keep(caches, keys, &dec.sampled, adapter_on);
            }
            Ok(Started::Done(completion))
        }
        Begun::Decoding {
            out,
            step,
            usage,
            timings,
            prefill_start,
        } => Ok(Started::Decoding(Sequence {
            id,
            dec,
            out,
            on_delta,
            cancel: cancel.clone(),
            max_new_tokens: req.max_new_tokens,
            keep,
            step,
            n: 0,
            usage,
            timings,
            prefill_start,
            decode_start: Instant::now(),
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
    },
}

/// Prefills the prompt from `reused` (what the prompt cache held) on, unless a joint pass
/// did, after what was prefilled `ahead`, and queues the first step; a speculative request
/// decodes to its end here.
fn begin<'a>(
    dec: &mut Decoder<'a>,
    req: &GenerateRequest,
    prompt: &PromptInputs,
    (reused, prefilled, ahead): (usize, Option<Prefilled>, Option<interleave::Ahead>),
    on_delta: &mut dyn FnMut(Delta),
    cancel: &CancelToken,
) -> Result<Begun<'a>> {
    let ctx = dec.ctx.clone();
    let prompt_ids = &prompt.ids[..];
    let (done, prefill_start, first) = match (prefilled, ahead) {
        (Some(p), _) => (prompt_ids.len() - reused, p.began, Some(p.logits)),
        (None, Some(a)) => (a.done, a.began, None),
        (None, None) => (0, Instant::now(), None),
    };
    dec.next = reused + done;
    let mut out = Output::new(
        ctx.tokenizer.detokenizer(),
        &req.stop,
        req.logprobs,
        ctx.tokenizer,
        ctx.markup.clone(),
    );
    let usage = Usage {
        prompt_tokens: prompt_ids.len(),
        cached_tokens: reused,
        ..Usage::default()
    };
    let cancelled = |out: Output<'_>| {
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
            Some(crate::runtime::prompt::merged_embeddings(
                ctx.model, vision, prompt, reused,
            )?)
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
    let Some(mut drafter) = drafter else {
        return Ok(Begun::Decoding {
            out,
            step,
            usage,
            timings,
            prefill_start,
        });
    };
    step.token.eval()?;
    timings.prompt_ms = ms(prefill_start);
    timings.ttft_ms = ms(ctx.started);
    let decode_start = Instant::now();
    let (finish, n) =
        speculative::decode(dec, req, &mut drafter, step, &mut out, on_delta, cancel)?;
    crate::layers::device::synchronize()?;
    timings.predicted_n = out.ids.len();
    timings.predicted_ms = if n > 0 { ms(decode_start) } else { 0.0 };
    let usage = Usage {
        completion_tokens: out.ids.len(),
        drafted_tokens: drafter.drafted,
        accepted_tokens: drafter.accepted,
        ..usage
    };
    Ok(Begun::Done(
        out.finish_with(finish, usage, timings, on_delta),
    ))
}

/// One decode step of every sequence in `seqs`: one forward pass over all of them (row by row
/// where they differ: `LanguageModel::forward_rows`), then each reads its token and streams
/// it. Those that end leave `seqs` and come back with their completion (or error); their
/// caches go back to `cache`. Each sequence's tokens are those it would get alone: its own
/// sampler, constraint, stop strings and cache, and the same pipelining (its step n+1 is
/// queued before its token n is read). With `padded`, rows attend together over it where
/// they can (`generate/padded.rs`); their last bits may then differ from a lone run's.
pub(crate) fn advance(
    seqs: &mut Vec<Sequence<'_>>,
    cache: &mut PromptCache,
    mut padded: Option<&mut PaddedCache>,
) -> Vec<(usize, Result<Completion>)> {
    // Asked once per step: both uses below must see the same answer on every rank.
    let cancelled: Vec<Result<bool>> = (seqs.iter())
        .map(|s| s.dec.ctx.cancelled(&s.cancel))
        .collect();
    let go: Vec<bool> = (seqs.iter().zip(&cancelled))
        .map(|(s, c)| matches!(c, Ok(false)) && s.n < s.max_new_tokens)
        .collect();
    let mut nexts = queue_next(seqs, &go, padded.as_deref_mut());
    let mut done = Vec::new();
    let all = std::mem::take(seqs);
    for ((mut s, cancelled), next) in all.into_iter().zip(cancelled).zip(nexts.drain(..)) {
        let outcome = cancelled.and_then(|c| s.take_step(c, next));
        match outcome {
            Ok(None) => seqs.push(s),
            Ok(Some(finish)) => {
                let back = padded
                    .as_deref_mut()
                    .map_or(Ok(()), |p| padded::release(&mut s, p));
                done.push((s.id, back.and_then(|()| s.finish(finish, cache))))
            }
            Err(e) => {
                // Its row (if any) is dropped now, not kept until the next step.
                if let Some(p) = padded.as_deref_mut() {
                    let _ = padded::release(&mut s, p);
                }
                done.push((s.id, Err(e)))
            }
        }
    }
    done
}

/// Queues step n+1 of each sequence marked in `go`: their logits from one forward pass (rows
/// of a batch when there are several), then, unconstrained, the sampled token too. Constrained,
/// only the logits are: the mask needs token n, and is computed while that pass runs.
fn queue_next(
    seqs: &mut [Sequence<'_>],
    go: &[bool],
    padded: Option<&mut PaddedCache>,
) -> Vec<Option<Result<Next>>> {
    let mut nexts: Vec<Option<Result<Next>>> = go.iter().map(|_| None).collect();
    let members: Vec<usize> = (0..seqs.len()).filter(|&i| go[i]).collect();
    let rows = match padded {
        Some(p) => padded::prepare(seqs, &members, p).and_then(|on| match on {
            true => padded::logits(seqs, &members, p).map(Some),
            false => Ok(None),
        }),
        None => Ok(None),
    };
    match rows {
        Ok(Some(rows)) => {
            for (i, logits) in members.into_iter().zip(rows) {
                nexts[i] = Some(seqs[i].dec.queue(logits));
            }
        }
        Err(e) => {
            let why = match e {
                EngineError::Generation(why) => why,
                other => other.to_string(),
            };
            for i in members {
                nexts[i] = Some(Err(EngineError::Generation(why.clone())));
            }
        }
        Ok(None) if members.is_empty() => {}
        Ok(None) => queue_unpadded(seqs, &members, &mut nexts),
    }
    nexts
}

/// [`queue_next`] for `members` with their own caches: alone, or as rows attending one by one.
fn queue_unpadded(
    seqs: &mut [Sequence<'_>],
    members: &[usize],
    nexts: &mut [Option<Result<Next>>],
) {
    if let [i] = members[..] {
        let s = &mut seqs[i];
        let token = s.step.token.clone();
        let logits = s.dec.logits(&token, None);
        nexts[i] = Some(logits.and_then(|l| s.dec.queue(l)));
    } else {
        match rows_logits(seqs, members) {
            Ok(rows) => {
                for (&i, logits) in members.iter().zip(rows) {
                    nexts[i] = Some(seqs[i].dec.queue(logits));
                }
            }
            Err(e) => {
                for &i in members {
                    nexts[i] = Some(Err(EngineError::Generation(e.to_string())));
                }
            }
        }
    }
}

/// The next logits `(1, V)` of each of `members` (indices into `seqs`, same model), from one
/// forward pass over their tokens as a batch.
fn rows_logits(seqs: &mut [Sequence<'_>], members: &[usize]) -> Result<Vec<Array>> {
    let model = seqs[members[0]].dec.ctx.model;
    let mut batch: Vec<&mut Sequence<'_>> = (seqs.iter_mut().enumerate())
        .filter(|(i, _)| members.contains(i))
        .map(|(_, s)| s)
        .collect();
    let tokens: Vec<Array> = batch.iter().map(|s| s.step.token.clone()).collect();
    let ids = ops::concatenate(&tokens, 0)?.reshape(&[-1, 1])?;
    let mut caches: Vec<&mut [KvCache]> = (batch.iter_mut())
        .map(|s| s.dec.caches.as_mut_slice())
        .collect();
    let logits = model.forward_rows(&ids, &mut caches)?;
    (batch.into_iter().zip(&tokens).enumerate())
        .map(|(b, (s, token))| s.dec.row_logits(&logits, b, token))
        .collect()
}

impl Decoder<'_> {
    /// Queues what follows `logits` (see [`queue_next`]).
    fn queue(&mut self, logits: Array) -> Result<Next> {
        if self.guide.is_some() {
            transforms::async_eval([&logits])?;
            return Ok(Next::Logits(logits));
        }
        let next = self.sample(logits, None)?;
        transforms::async_eval([&next.token, &next.logprobs])?;
        Ok(Next::Step(next))
    }
}

impl Sequence<'_> {
    /// Reads this step's token and streams it; the finish reason when the generation ends
    /// here. `next` is step n+1, queued unless cancelled or at `max_new_tokens`.
    fn take_step(
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
    fn finish(mut self, finish: FinishReason, cache: &mut PromptCache) -> Result<Completion> {
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
        if let Some(keys) = &self.keep {
            let caches = std::mem::take(&mut self.dec.caches);
            cache.keep(caches, keys, &self.dec.sampled, self.dec.ctx.adapter_on);
        }
        Ok(completion)
    }
}

/// What is queued ahead of the token being read: a whole step, or (constrained) its logits.
enum Next {
    Step(Step),
    Logits(Array),
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Generated tokens turned into deltas: detokenized, stop sequences held back.
struct Output<'t> {
    detok: StreamingDetokenizer,
    stops: StopMatcher,
    logprobs: usize,
    tokenizer: &'t text::ModelTokenizer,
    ids: Vec<u32>,
    text: String,
    index: usize,
    pending_logprobs: Vec<TokenLogprob>,
    markup: Option<Markup>,
    /// With markup: the channel of the text held back so far (and of the next token).
    channel: Channel,
}

impl<'t> Output<'t> {
    fn new(
        detok: StreamingDetokenizer,
        stop: &[String],
        logprobs: usize,
        tokenizer: &'t text::ModelTokenizer,
        markup: Option<Markup>,
    ) -> Self {
        Self {
            detok,
            stops: StopMatcher::new(stop),
            logprobs,
            tokenizer,
            ids: Vec::new(),
            text: String::new(),
            index: 0,
            pending_logprobs: Vec::new(),
            channel: markup
                .as_ref()
                .map_or(Channel::Content, Markup::first_channel),
            markup,
        }
    }

    /// Follows token `id` (its text `piece`) through the markup: whether its text is shown
    /// (harmony's structure is not), and the channel after it. Text held back in another
    /// channel goes out first.
    fn switch_channel(
        &mut self,
        id: u32,
        piece: &str,
        on_delta: &mut dyn FnMut(Delta),
    ) -> (bool, Channel) {
        let Some(m) = self.markup.as_mut() else {
            return (true, Channel::Content);
        };
        let (this, after) = m.next(id, piece, self.channel);
        let Some(this) = this else {
            return (false, self.channel);
        };
        if this != self.channel {
            // A stop sequence is not matched across the boundary.
            let held = self.stops.finish();
            self.emit(held, on_delta);
        }
        self.channel = this;
        (true, after)
    }

    /// Adds a token; returns true when a stop sequence ended the generation.
    fn push(&mut self, id: u32, logprobs: &Array, on_delta: &mut dyn FnMut(Delta)) -> Result<bool> {
        let piece = self
            .detok
            .push(id)
            .map_err(|e| EngineError::Generation(e.to_string()))?;
        let (shown, after) = self.switch_channel(id, &piece, on_delta);
        self.ids.push(id);
        if self.logprobs > 0 {
            self.pending_logprobs
                .push(self.token_logprob(id, logprobs)?);
        }
        if !shown {
            return Ok(false);
        }
        let outcome = self.stops.push(&piece);
        self.emit(outcome.text, on_delta);
        if after != self.channel {
            let held = self.stops.finish();
            self.emit(held, on_delta);
            self.channel = after;
        }
        Ok(outcome.stopped.is_some())
    }

    fn emit(&mut self, text: String, on_delta: &mut dyn FnMut(Delta)) {
        if text.is_empty() && self.pending_logprobs.is_empty() {
            return;
        }
        self.text.push_str(&text);
        on_delta(Delta {
            index: self.index,
            text,
            tokens: std::mem::take(&mut self.pending_logprobs),
            channel: self.markup.as_ref().map(|_| self.channel),
        });
        self.index += 1;
    }

    fn token_logprob(&self, id: u32, logprobs: &Array) -> Result<TokenLogprob> {
        let lp = logprobs.as_dtype(mlx_rs::Dtype::Float32)?;
        let values = lp.try_as_slice::<f32>()?;
        let mut order: Vec<u32> = (0..values.len() as u32).collect();
        let k = self.logprobs.min(values.len());
        order.select_nth_unstable_by(k - 1, |a, b| {
            values[*b as usize].total_cmp(&values[*a as usize])
        });
        order.truncate(k);
        order.sort_by(|a, b| values[*b as usize].total_cmp(&values[*a as usize]));
        Ok(TokenLogprob {
            id,
            text: self.tokenizer.decode(&[id], false).unwrap_or_default(),
            logprob: values[id as usize],
            top: order.into_iter().map(|t| (t, values[t as usize])).collect(),
        })
    }

    /// Flushes held-back text (unless a stop sequence cut it) and builds the completion.
    fn finish_with(
        mut self,
        mut reason: FinishReason,
        usage: Usage,
        timings: Timings,
        on_delta: &mut dyn FnMut(Delta),
    ) -> Completion {
        if reason != FinishReason::StopSequence {
            let tail = self.detok.finish().unwrap_or_default();
            let outcome = self.stops.push(&tail);
            let mut text = outcome.text;
            if outcome.stopped.is_some() {
                reason = FinishReason::StopSequence;
            } else {
                text.push_str(&self.stops.finish());
            }
            self.emit(text, on_delta);
        }
        self.finish(reason, usage, timings)
    }

    fn finish(self, reason: FinishReason, usage: Usage, timings: Timings) -> Completion {
        Completion {
            text: self.text,
            token_ids: self.ids,
            finish_reason: reason,
            tool_calls: Vec::new(),
            usage,
            timings,
        }
    }
}
