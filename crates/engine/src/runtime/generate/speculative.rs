//! Speculative decoding: draft tokens (`drafters.rs`: from the sequence itself, a smaller draft
//! model with the same tokenizer, the model's own multi-token-prediction head, an EAGLE-3
//! drafter or a DFlash-style block drafter, the last three reading the model's hidden states) are checked by one forward pass of
//! the model over the last token and the draft, which gives the model's own choice at every
//! position. Drafts picked greedily or copied are taken while they agree with those choices,
//! plus the first that does not (or one past the draft): every token is still the model's,
//! sampled with the request's sampler from the logits of the sequence before it (mlx-lm's
//! acceptance rule), so greedy output is that of one-token steps, up to float differences
//! between a pass over several positions and one. Drafts drawn at random are judged by
//! speculative sampling's rule (`acceptance.rs`). The cache
//! positions of rejected draft tokens are trimmed away, in the model and in the draft model;
//! a recurrent layer's state is set back to the one it recorded after the last accepted position.
//! Under a constraint, the grammar follows the draft to give each position its mask, cuts the
//! draft where it refuses a token, and rolls back; the tokens taken are then followed as usual.

use mlx_rs::{transforms, Array};

use super::{
    acceptance,
    context::{GenerationContext, Result, CLEAR_CACHE_EVERY},
    drafters::{lookup, BlockDraft, ChainDraft, DraftModel},
    output::Output,
    state::SequenceState,
    state::Step,
};
use crate::{
    layers::kv_cache::KvCache,
    models::Tap,
    runtime::prompt_cache::{DraftCaches, DrafterKey},
    runtime::request::{Delta, Drafts, FinishReason, GenerateRequest, Speculative},
    runtime::resident::Draft,
    runtime::sampler::Sampler,
    CancelToken,
};

/// The hidden states of the model's passes that the drafter `method` asks for reads (`Auto`
/// resolved for the model `ctx` holds), if any.
pub(super) fn reads(method: Drafts, ctx: &GenerationContext<'_>) -> Option<Tap> {
    match (
        method.resolve(ctx.model.mtp_depth(), ctx.draft.is_some()),
        ctx.draft,
    ) {
        (Drafts::Mtp, _) => Some(Tap::Final),
        (Drafts::DraftModel, Some(Draft::Block(d))) => Some(Tap::Layers(d.target_layers.clone())),
        (Drafts::DraftModel, Some(Draft::Eagle3(d))) => Some(Tap::Layers(d.capture_layers.clone())),
        _ => None,
    }
}

/// Where drafts come from, and how many were drafted and accepted.
pub(super) struct Drafter<'a> {
    source: Source<'a>,
    /// The hidden states of the verification pass drafting reads ([`reads`]).
    tap: Option<Tap>,
    num_draft_tokens: usize,
    /// The last draft, until its outcome is known.
    last: Vec<u32>,
    /// The drafter's log-probabilities `(1, V)` each token of the last draft was drawn from,
    /// when drawn at random (empty when picked greedily or copied).
    q: Vec<Array>,
    /// The last verification's outcome, until the drafter is told ([`Self::settle`]).
    outcome: Option<Outcome>,
    pub drafted: usize,
    pub accepted: usize,
    /// Prompt positions its caches held from the prompt cache (not run again).
    pub reused: usize,
}

/// What a verification left: how many drafts were accepted, the model's token after them
/// (taken, not yet run), and the verification's hidden states the drafter reads.
struct Outcome {
    accepted: usize,
    next: Array,
    hidden: Option<Array>,
}

enum Source<'a> {
    /// The prompt, then every token taken so far.
    Lookup {
        history: Vec<u32>,
    },
    Model(DraftModel<'a>),
    /// The model's own multi-token-prediction head, or an EAGLE-3 drafter.
    Chain(ChainDraft<'a>),
    Block(BlockDraft<'a>),
}

impl<'a> Drafter<'a> {
    /// The drafter `spec` asks for, its draft model (if any) prefilled with the prompt but its
    /// last token; `None` when this generation cannot speculate (then it runs one token per pass).
    pub fn new(
        dec: &mut SequenceState<'a>,
        spec: Speculative,
        prompt: &[u32],
        cancel: &CancelToken,
    ) -> Result<Option<Self>> {
        let hidden = dec.hidden.take();
        if !dec.can_speculate() {
            return Ok(None);
        }
        let method = (spec.method).resolve(dec.ctx.model.mtp_depth(), dec.ctx.draft.is_some());
        // The prompt cache's drafter caches, when this drafter made them.
        let kept = dec.draft.take();
        let kept = |drafter: DrafterKey| {
            (kept.clone())
                .filter(|d| d.drafter == drafter)
                .map(|d| d.caches)
        };
        let mut reused = 0;
        let source = match method {
            // Auto resolves to one of the others.
            Drafts::PromptLookup | Drafts::Auto => Source::Lookup {
                history: prompt.to_vec(),
            },
            // `Engine::generate` refused the request when no drafter is loaded.
            Drafts::DraftModel => match dec.ctx.draft {
                Some(Draft::Model(model)) => {
                    let Some(mut draft) = DraftModel::new(model.as_ref(), kept(DrafterKey::Model))
                    else {
                        return Ok(None);
                    };
                    reused = draft.held();
                    draft.prefill(prompt, &dec.ctx, cancel)?;
                    Source::Model(draft)
                }
                Some(Draft::Eagle3(eagle3)) => {
                    let reads = (hidden, kept(DrafterKey::Eagle3));
                    match ChainDraft::new(dec.ctx.model, Some(eagle3), prompt, reads)? {
                        Some(chain) => Source::Chain(chain),
                        None => return Ok(None),
                    }
                }
                Some(Draft::Block(dflash)) => {
                    let reads = (hidden, kept(DrafterKey::Block));
                    match BlockDraft::new(dec.ctx.model, dflash, prompt, reads)? {
                        Some(block) => Source::Block(block),
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            },
            Drafts::Mtp => {
                let reads = (hidden, kept(DrafterKey::Mtp));
                match ChainDraft::new(dec.ctx.model, None, prompt, reads)? {
                    Some(mtp) => Source::Chain(mtp),
                    None => return Ok(None),
                }
            }
        };
        let depth = dec.ctx.model.mtp_depth();
        let num_draft_tokens = match (&source, dec.ctx.draft) {
            // A block holds the last token and its guesses.
            (Source::Block(block), _) => {
                let most = block.block_size() - 1;
                spec.num_draft_tokens.unwrap_or(most).min(most)
            }
            // EAGLE-3's release says how many it drafts; it chains as many as asked.
            (Source::Chain(_), Some(Draft::Eagle3(e))) if method == Drafts::DraftModel => {
                spec.num_draft_tokens.unwrap_or(e.block_size - 1)
            }
            _ => (spec.num_draft_tokens).unwrap_or(method.default_count(depth)),
        };
        Ok(Some(Self {
            tap: reads(method, &dec.ctx),
            num_draft_tokens,
            last: Vec::new(),
            q: Vec::new(),
            outcome: None,
            drafted: 0,
            accepted: 0,
            // A chain or block drafter runs nothing before the first token is taken.
            reused: match &source {
                Source::Chain(chain) => chain.held(),
                Source::Block(block) => block.held(),
                _ => reused,
            },
            source,
        }))
    }

    /// Tells the drafter the last verification's outcome, if it has not been told.
    fn settle(&mut self) -> Result<()> {
        let Some(Outcome {
            accepted,
            next,
            hidden,
        }) = self.outcome.take()
        else {
            return Ok(());
        };
        self.taken(accepted, next.item_exact::<u32>(), hidden.as_ref())
    }

    /// The drafter's caches, brought to the model's positions, for the prompt cache; `None`
    /// for prompt lookup, or when they cannot be brought there.
    pub fn into_caches(mut self) -> Option<DraftCaches> {
        self.settle().ok()?;
        let (drafter, caches) = match self.source {
            Source::Lookup { .. } => return None,
            Source::Model(model) => (DrafterKey::Model, model.into_caches().ok()?),
            Source::Chain(chain) => {
                let drafter = match chain.is_mtp() {
                    true => DrafterKey::Mtp,
                    false => DrafterKey::Eagle3,
                };
                (drafter, chain.into_caches())
            }
            Source::Block(block) => (DrafterKey::Block, block.into_caches().ok()?),
        };
        Some(DraftCaches {
            drafter,
            caches,
            follows: None,
        })
    }

    /// Up to `limit` (and `num_draft_tokens`) tokens to follow the sequence; a model drafter
    /// draws them at random when `sampler` does.
    fn draft(&mut self, limit: usize, sampler: &mut Sampler) -> Result<Vec<u32>> {
        let limit = limit.min(self.num_draft_tokens);
        self.q.clear();
        let q = sampler.is_random().then_some(&mut self.q);
        self.last = match &mut self.source {
            Source::Lookup { history } => lookup(history, limit),
            Source::Model(draft) => draft.draft(limit, sampler, q)?,
            Source::Chain(chain) => chain.draft(limit, sampler, q)?,
            Source::Block(block) => block.draft(limit, sampler, q)?,
        };
        self.drafted += self.last.len();
        Ok(self.last.clone())
    }

    /// Only the first `n` tokens of the last draft are verified (a constraint refused the rest).
    fn cut(&mut self, n: usize) {
        self.drafted -= self.last.len() - n;
        // The odds of the first draft cut stay: the constraint refused it, so the model's token
        // there is drawn as for a rejected draft ([`acceptance::judge`]).
        self.q.truncate(n + 1);
    }

    /// The first `accepted` tokens of the last draft were taken, then `next`; `hidden`: the
    /// verification pass's hidden states, those `tap` names.
    fn taken(&mut self, accepted: usize, next: u32, hidden: Option<&Array>) -> Result<()> {
        self.accepted += accepted;
        let draft = std::mem::take(&mut self.last);
        match &mut self.source {
            Source::Lookup { history } => {
                history.extend(&draft[..accepted]);
                history.push(next);
            }
            Source::Model(model) => model.taken(&draft, accepted, next),
            Source::Chain(chain) => chain.taken(&draft, accepted, next, hidden)?,
            Source::Block(block) => block.taken(accepted, next, hidden)?,
        }
        Ok(())
    }
}

/// A verification pass: the step sampled at each position, the penalty history each had, and
/// (when asked) the model's hidden states `(1, k + 1, _)`.
struct Verified {
    steps: Vec<Step>,
    recents: Vec<Option<Array>>,
    hidden: Option<Array>,
}

impl SequenceState<'_> {
    /// Whether draft positions can be taken back: every cache a plain KV cache or a recurrent
    /// state (which records the verification's steps; not a sliding-window ring or a quantized
    /// cache). A constraint can: its grammar follows a draft and rolls back. Explicit rotary
    /// positions (Qwen-VL's M-RoPE after an image) can: a token's are a function of its index.
    fn can_speculate(&self) -> bool {
        self.ctx.kv_bits.is_none() && self.caches.iter().all(KvCache::can_take_back)
    }

    /// Runs `tokens` through the model in one pass and samples at every position, each with the
    /// penalty history it would have had as a single step and the constraint's mask there
    /// (`masks[i]` at position `i`; a position past them is never taken); with `tap`, the
    /// model's hidden states it names too.
    fn verify(&mut self, tokens: &[u32], masks: Vec<Array>, tap: Option<&Tap>) -> Result<Verified> {
        self.caches.iter_mut().for_each(KvCache::record_steps);
        let input = Array::from_slice(tokens, &[tokens.len() as i32]);
        let (logits, hidden) = self.run(&input, None, tap)?;
        let mut steps = Vec::with_capacity(tokens.len());
        let mut recents = Vec::with_capacity(tokens.len());
        let mut masks = masks.into_iter();
        for (i, &token) in tokens.iter().enumerate() {
            let row = logits.take_axis(Array::from_int(i as i32), 1)?;
            self.remember(&Array::from_slice(&[token], &[1]))?;
            steps.push(self.sample(row, masks.next())?);
            recents.push(self.recent.clone());
        }
        Ok(Verified {
            steps,
            recents,
            hidden,
        })
    }

    /// Forgets the last `n` positions fed to the model (of the verification pass just run).
    fn rewind(&mut self, n: usize) -> Result<()> {
        for cache in &mut self.caches {
            if !cache.trim(n as i32) {
                return Err(mlx_rs::error::Exception::custom(
                    "a speculative verification could not take back its rejected positions",
                )
                .into());
            }
        }
        self.next -= n;
        Ok(())
    }
}

/// How [`decode`] ended, and how many tokens it took.
pub(super) enum Decoded {
    Finished(FinishReason, usize),
    /// Handed back to one-token steps at this step, not yet taken (its token not yet run): the
    /// sequence goes on in a batch.
    HandedOff(Step, usize),
}

/// Decodes from `first` (the prompt's next token, evaluated) with drafts from `drafter`, until
/// the end or until `hand_off` says other generations want the model (asked before each round).
pub(super) fn decode(
    dec: &mut SequenceState<'_>,
    req: &GenerateRequest,
    drafter: &mut Drafter<'_>,
    first: Step,
    out: &mut Output<'_>,
    on_delta: &mut dyn FnMut(Delta),
    (cancel, hand_off): (&CancelToken, &mut dyn FnMut() -> bool),
) -> Result<Decoded> {
    drafter.outcome = Some(Outcome {
        accepted: 0,
        next: first.token.clone(),
        hidden: None,
    });
    let mut pending = vec![first];
    let (mut n, mut since_clear) = (0usize, 0usize);
    loop {
        // The steps before the last are in the caches already (accepted drafts); the last is
        // not, as a batched sequence's next step is not.
        let handing = hand_off();
        let last = handing.then(|| pending.pop().expect("a step to take"));
        for step in &pending {
            if dec.ctx.cancelled(cancel)? {
                return Ok(Decoded::Finished(FinishReason::Cancelled, n));
            }
            if n == req.max_new_tokens {
                return Ok(Decoded::Finished(FinishReason::Length, n));
            }
            if let Some(finish) = dec.take(step, out, on_delta)? {
                return Ok(Decoded::Finished(finish, n));
            }
            n += 1;
        }
        if let Some(step) = last {
            return Ok(Decoded::HandedOff(step, n));
        }
        // The last token is taken but not yet run.
        let last = *dec.sampled.last().expect("a token was taken");
        drafter.settle()?;
        if dec.ctx.cancelled(cancel)? {
            return Ok(Decoded::Finished(FinishReason::Cancelled, n));
        }
        if n == req.max_new_tokens {
            return Ok(Decoded::Finished(FinishReason::Length, n));
        }
        since_clear += pending.len();
        if since_clear >= CLEAR_CACHE_EVERY {
            mlx_rs::memory::clear_cache()?;
            since_clear = 0;
        }
        // The token after the last draft must fit in max_new_tokens too.
        let mut draft = drafter.draft(req.max_new_tokens - n - 1, &mut dec.sampler)?;
        let masks = match dec.guide.as_mut() {
            Some(guide) => {
                let masks = guide.draft_masks(&mut draft, dec.ctx.eos)?;
                drafter.cut(draft.len());
                masks
            }
            None => Vec::new(),
        };
        let tokens: Vec<u32> = std::iter::once(last).chain(draft.iter().copied()).collect();
        let Verified {
            mut steps,
            mut recents,
            hidden: verified,
        } = dec.verify(&tokens, masks, drafter.tap.as_ref())?;
        let accepted = match drafter.q.is_empty() {
            // Drafts drawn at random: speculative sampling's rule, by the drafter's odds.
            false => acceptance::judge(&mut dec.sampler, &mut steps, &draft, &drafter.q)?,
            // Drafts copied or picked greedily: kept while the model's own choice equals them.
            true => {
                transforms::eval(steps.iter().map(|s| &s.token))?;
                (draft.iter().zip(&steps))
                    .take_while(|(d, s)| s.token.item_exact::<u32>() == **d)
                    .count()
            }
        };
        dec.rewind(draft.len() - accepted)?;
        dec.recent = recents.swap_remove(accepted);
        pending = steps;
        pending.truncate(accepted + 1);
        drafter.outcome = Some(Outcome {
            accepted,
            next: pending[accepted].token.clone(),
            hidden: verified,
        });
    }
}
