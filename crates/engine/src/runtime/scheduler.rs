//! Continuous batching: generations on one resident model share each decode step's forward pass
//! (one pass over the weights serves them all), joining between steps and leaving when they end,
//! each with its own sampler, constraint, stop strings, caches and stream. A sequence's tokens are
//! those it gets alone: the batch runs the weights over its rows together and attention row by row
//! (`Caches::Rows`, or one padded cache: `Caches::Padded`). A long prompt prefills a chunk per step
//! while the others decode (`generate/interleave.rs`).

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

use crate::{
    layers::device::on_gpu,
    layers::kv_cache::PaddedCache,
    runtime::constrained::ToolUse,
    runtime::footprint,
    runtime::generate::{advance, open, resume, together, Opened, Sequence, Started},
    runtime::prepare::{finish, prepare, Prepared},
    runtime::prompt::PromptInputs,
    runtime::prompt_cache::{Owner, PromptCache},
    runtime::request::{Completion, Delta, GenerateRequest},
    runtime::resident::View,
    CancelToken, EngineError, Group,
};

/// A generation handed to `Engine::generate_batch`: the request, its cancel token, where
/// its deltas go and where its answer goes.
pub struct Admission<'f> {
    pub req: GenerateRequest,
    pub cancel: CancelToken,
    pub on_delta: Box<dyn FnMut(Delta) + 'f>,
    pub on_done: Box<dyn FnOnce(Result<Completion, EngineError>) + 'f>,
}

/// How the rows of a batch attend (docs/decisions/batching.md). The default is padded on every
/// device since 2026-12-05, when the CPU's padded step became bit for bit the rows' and
/// measured faster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchAttention {
    /// Row by row, each over its sequence's own caches: every row's bits are those it gets
    /// alone (on the CPU; on a GPU a batched matmul may sum otherwise).
    Rows,
    /// All rows over one right-padded cache (models whose layers are all full attention;
    /// others attend row by row): one cache write per layer and step, and the scores and
    /// softmax of all rows in one pass. On the CPU the weighted sums of values stay row by row
    /// and prefills alone, so every row's bits are still its lone run's; on a GPU attention is
    /// one fused call and requests arriving together prefill in one pass: fewer kernels, but a
    /// row's last bits may differ from its lone run's. The default.
    #[default]
    Padded,
}

/// What `Engine::generate_batch` asks between steps for the next generation to join: given a
/// test of what can, the next request if it passes.
pub type More<'f> = dyn FnMut(&dyn Fn(&GenerateRequest) -> bool) -> Option<Admission<'f>> + 'f;

/// A generation set up to join the batch once its prompt is prefilled (a long one a chunk per
/// step while in `Batch::prefilling`).
struct Joiner<'a> {
    id: usize,
    opened: Opened<'a>,
    req: GenerateRequest,
    prompt: PromptInputs,
    cancel: CancelToken,
    on_delta: Box<dyn FnMut(Delta) + 'a>,
}

/// What a running sequence's end still needs.
struct Pending<'f> {
    on_done: Box<dyn FnOnce(Result<Completion, EngineError>) + 'f>,
    tools: Option<ToolUse>,
}

/// Where the sequences of one batch come from and go.
struct Batch<'a> {
    view: View<'a>,
    group: Option<&'a Group>,
    prefill_chunk: usize,
    seqs: Vec<Sequence<'a>>,
    /// The rows' caches while they attend padded ([`BatchAttention::Padded`]).
    padded: Option<PaddedCache>,
    /// Whether requests that arrive together prefill in one pass (padded attention on a GPU).
    together: bool,
    /// Whether a long prompt prefills a chunk per step while the others decode
    /// (`generate/interleave.rs`): when others can join.
    interleave: bool,
    /// Long prompts prefilling a chunk per step, first come first.
    prefilling: VecDeque<Joiner<'a>>,
    /// By sequence id.
    pending: Vec<Option<Pending<'a>>>,
    /// Generations that fit in memory alone but not beside the rows running, held back (first
    /// come first) until a row ends, and how many rows there were then.
    held: (Vec<(Admission<'a>, Instant)>, usize),
}

/// Where a batch runs: what [`run`] needs of the engine.
pub(crate) struct Setting<'a> {
    pub prefill_chunk: usize,
    pub attention: BatchAttention,
    /// Whether the resident is the active model (requests naming no model run on it).
    pub active: bool,
    pub group: Option<&'a Group>,
    pub max_batch: usize,
}

/// Runs `first` on the resident `view` shows, and with it, joining between its decode steps,
/// each generation `more` hands over (see `Engine::generate_batch`). A lone generation is a
/// batch of one: every generation runs here.
pub(crate) fn run<'a, 'f: 'a>(
    on: Setting<'a>,
    view: View<'a>,
    cache: &'a mut PromptCache,
    vocabulary: &'a mut Option<constrain::Vocabulary>,
    (first, started): (Admission<'f>, Instant),
    more: &mut More<'f>,
) {
    let Setting {
        prefill_chunk,
        attention,
        active,
        group,
        max_batch,
    } = on;
    let batching = view.model.facts().batching;
    let batched = max_batch > 1 && group.is_none() && batching.rows;
    let adapter_on = view.adapter_on(&first.req);
    let id = view.info.model_id.clone();
    // A speculative generation joins too: it speculates only while it runs alone, then hands
    // its sequence to one-token steps (`speculative::decode`).
    let fits = |req: &GenerateRequest| {
        batched
            && view.adapter_on(req) == adapter_on
            && req.model.as_deref().map_or(active, |m| m == id)
    };
    let open = fits(&first.req);
    // Whether a waiting generation would join (looked at, not taken).
    let waiting = |more: &mut More<'f>| {
        if !open {
            return false;
        }
        let found = std::cell::Cell::new(false);
        more(&|req| {
            found.set(found.get() || fits(req));
            false
        });
        found.get()
    };
    let padded = batched && attention == BatchAttention::Padded && batching.padded;
    let mut batch = Batch {
        view,
        group,
        prefill_chunk,
        seqs: Vec::new(),
        padded: padded.then(PaddedCache::default),
        // A joint prefill's rows get other bits than lone prefills on the CPU (docs/traps.md,
        // "A matmul row's bits depend on how many rows ride with it").
        together: batched && attention == BatchAttention::Padded && on_gpu(),
        interleave: open,
        prefilling: VecDeque::new(),
        pending: Vec::new(),
        held: (Vec::new(), 0),
    };
    let mut arriving: Vec<(Admission<'a>, Instant)> = vec![(first, started)];
    loop {
        // Between two steps: with a joint prefill every waiting request that fits joins;
        // else one, so that each one's first token comes after its own prefill and one
        // step, not after every other joiner's prefill.
        let taken = batch.seqs.len() + batch.prefilling.len();
        let room = match batch.together {
            true => max_batch,
            false => max_batch.min(taken + 1),
        };
        // Those held back try again once a row has ended (or one was cancelled); meanwhile
        // nothing overtakes them.
        let (held, beside) = &mut batch.held;
        let cancelled = held.iter().any(|(a, _)| a.cancel.is_cancelled());
        if !held.is_empty() && (taken < *beside || cancelled) {
            arriving.append(held);
        }
        while open && batch.held.0.is_empty() && taken + arriving.len() < room {
            match more(&fits) {
                Some(admission) => arriving.push((admission, Instant::now())),
                None => break,
            }
        }
        if !arriving.is_empty() {
            let arrived = std::mem::take(&mut arriving);
            batch.admit(cache, vocabulary, arrived, &mut || waiting(more));
        }
        batch.prefill_step(cache, &mut || waiting(more));
        if batch.seqs.is_empty() {
            match batch.prefilling.is_empty() && batch.held.0.is_empty() {
                true => return,
                false => continue,
            }
        }
        for (id, result) in advance(&mut batch.seqs, cache, batch.padded.as_mut()) {
            batch.done(id, result);
        }
    }
}

impl<'a> Batch<'a> {
    /// Prepares and prefills `admissions` (with padded attention, in one pass where they can:
    /// `generate/together.rs`); each joins the running sequences, or is answered here when it
    /// already ended (an error, a cancel during prefill, a speculative run).
    fn admit(
        &mut self,
        cache: &mut PromptCache,
        vocabulary: &mut Option<constrain::Vocabulary>,
        admissions: Vec<(Admission<'a>, Instant)>,
        waiting: &mut dyn FnMut() -> bool,
    ) {
        let mut opened = Vec::new();
        for (admission, started) in admissions {
            // Beside it: the rows decoding, and those still to prefill (counted whole: what
            // a long prompt prefilled so far is in MLX's memory already, twice is on the safe
            // side), those admitted with it among them.
            let unfilled = |p: &Joiner| (0, p.prompt.ids.len() + p.req.max_new_tokens);
            let others = || {
                (self.seqs.iter().map(Sequence::positions))
                    .chain(self.prefilling.iter().chain(&opened).map(unfilled))
            };
            let prepared = prepare(self.view, vocabulary, &admission.req);
            if let Ok(prep) = &prepared {
                let asked = (prep.prompt.cache_keys.len(), prep.req.max_new_tokens);
                let footprint = self.view.footprint;
                if !admission.cancel.is_cancelled()
                    && footprint::waits(footprint, asked, cache, others())
                {
                    let rows = self.seqs.len() + self.prefilling.len() + opened.len();
                    tracing::info!(
                        rows,
                        "a generation waits for the rows beside it to end: it fits in memory alone"
                    );
                    self.held.1 = rows;
                    self.held.0.push((admission, started));
                    continue;
                }
            }
            let Admission {
                req: _,
                cancel,
                on_delta,
                on_done,
            } = admission;
            let id = self.pending.len();
            let admitted = prepared.and_then(|mut prep| {
                let keys = &prep.prompt.cache_keys[..];
                let owner = Owner {
                    adapter_on: prep.adapter_on,
                    conversation: prep.req.conversation.clone(),
                };
                // A conversation on disk comes back before the memory is counted.
                let make = || self.view.model.make_caches();
                cache.read_in(keys, owner.adapter_on, &make, footprint::free_bytes());
                let prompt = (keys, &owner, !prep.req.persist);
                let max_new = &mut prep.req.max_new_tokens;
                footprint::admit(self.view.footprint, prompt, max_new, cache, others())?;
                Ok(prep)
            });
            let prep = match admitted {
                Ok(prep) => prep,
                Err(e) => {
                    on_done(Err(e));
                    continue;
                }
            };
            let ctx = (self.view).context(&prep, started, self.prefill_chunk, self.group);
            let Prepared {
                req,
                prompt,
                tools,
                guide,
                ..
            } = prep;
            self.pending.push(Some(Pending { on_done, tools }));
            match open(Rc::new(ctx), &req, &prompt, cache, guide) {
                Ok(o) => opened.push(Joiner {
                    id,
                    opened: o,
                    req,
                    prompt,
                    cancel,
                    on_delta,
                }),
                Err(e) => self.done(id, Err(e)),
            }
        }
        let mut joint: Vec<_> = (opened.iter_mut())
            .filter(|_| self.together)
            .map(|p| (&mut p.opened, &p.prompt, &p.cancel))
            .collect();
        together::prefill(&mut joint);
        let count = opened.len();
        for (i, p) in opened.into_iter().enumerate() {
            // Those admitted with it count as others, though not yet running.
            let mut waiting = || i + 1 < count || waiting();
            match self.interleave && p.opened.long(&p.prompt) {
                true => self.prefilling.push_back(p),
                false => self.join(p, cache, &mut waiting),
            }
        }
    }

    /// The first long prompt's next chunk; once one chunk is left, it is prefilled and the
    /// generation joins (or is answered: cancelled, failed). A cancelled one is answered at
    /// once, wherever it waits.
    fn prefill_step(&mut self, cache: &mut PromptCache, waiting: &mut dyn FnMut() -> bool) {
        while let Some(i) = (self.prefilling.iter()).position(|p| p.cancel.is_cancelled()) {
            let p = self.prefilling.remove(i).unwrap();
            self.join(p, cache, waiting);
        }
        let Some(p) = self.prefilling.front_mut() else {
            return;
        };
        if p.opened.long(&p.prompt) {
            if let Err(e) = p.opened.prefill_ahead(&p.prompt) {
                let id = p.id;
                self.prefilling.pop_front();
                self.done(id, Err(e));
            }
            return;
        }
        let p = self.prefilling.pop_front().unwrap();
        self.join(p, cache, waiting);
    }

    /// Prefills what is left of `p`'s prompt and queues its first step: it joins the running
    /// sequences, or is answered here when it already ended. A speculative generation decodes
    /// here while it is alone: until another runs or one is `waiting` to join.
    fn join(&mut self, p: Joiner<'a>, cache: &mut PromptCache, waiting: &mut dyn FnMut() -> bool) {
        let id = p.id;
        let others = !self.seqs.is_empty() || !self.prefilling.is_empty();
        let mut hand_off = || others || waiting();
        match resume(
            id,
            p.opened,
            &p.req,
            &p.prompt,
            cache,
            p.on_delta,
            (&p.cancel, &mut hand_off),
        ) {
            Ok(Started::Decoding(seq)) => self.seqs.push(seq),
            Ok(Started::Done(completion)) => self.done(id, Ok(completion)),
            Err(e) => self.done(id, Err(e)),
        }
    }

    /// Answers sequence `id`.
    fn done(&mut self, id: usize, mut result: Result<Completion, EngineError>) {
        let Some(Pending { on_done, tools }) = self.pending[id].take() else {
            return;
        };
        finish(self.view, tools.as_ref(), &mut result);
        on_done(result);
    }
}
