//! Speculative decoding: draft tokens, from the sequence itself (prompt lookup: what followed an
//! earlier occurrence of the last few tokens, in the prompt or the output) or from a smaller
//! draft model with the same tokenizer, or from the model's own multi-token-prediction head
//! (reading the model's hidden states, `models/decoder/mtp.rs`), are checked by one forward pass of the model over the
//! last token and the draft, which gives the model's own choice at every position. The choices
//! are taken while they agree with the draft, plus the first that does not (or one past the
//! draft): every token is still the model's, sampled with the request's sampler from the logits
//! of the sequence before it (mlx-lm's acceptance rule), so greedy output is that of one-token
//! steps, up to float differences between a pass over several positions and one. The cache
//! positions of rejected draft tokens are trimmed away, in the model and in the draft model;
//! a recurrent layer's state is set back to the one it recorded after the last accepted position.
//! Under a constraint, the grammar follows the draft to give each position its mask, cuts the
//! draft where it refuses a token, and rolls back; the tokens taken are then followed as usual.

use mlx_rs::{ops, transforms, Array};

use super::{
    context::GenerationContext, context::Result, context::CLEAR_CACHE_EVERY, output::Output,
    state::SequenceState, state::Step,
};
use crate::{
    layers::kv_cache::Caches,
    layers::kv_cache::KvCache,
    models::Input,
    models::LanguageModel,
    runtime::request::{Delta, Drafts, FinishReason, GenerateRequest, Speculative},
    CancelToken,
};

/// The longest suffix of the sequence looked up in it; shorter ones are tried after.
const MAX_NGRAM: usize = 3;

/// Where drafts come from, and how many were drafted and accepted.
pub(super) struct Drafter<'a> {
    source: Source<'a>,
    num_draft_tokens: usize,
    /// The last draft, until its outcome is known.
    last: Vec<u32>,
    pub drafted: usize,
    pub accepted: usize,
}

enum Source<'a> {
    /// The prompt, then every token taken so far.
    Lookup {
        history: Vec<u32>,
    },
    Model(DraftModel<'a>),
    Mtp(MtpDraft<'a>),
}

/// The model's own multi-token-prediction head (mlx-vlm's MTP drafter): its caches hold a
/// position for every token taken whose preceding hidden state the model gave.
struct MtpDraft<'a> {
    model: &'a dyn LanguageModel,
    caches: Vec<KvCache>,
    /// The head's guess `(1, 1)` for the token after the last one taken, and its own hidden
    /// state there `(1, 1, H)`, from which it chains.
    seed: Option<(Array, Array)>,
    /// Positions the head ran while drafting the last draft (on its own hidden states).
    appended: usize,
    /// Until the first token is taken: the prompt tokens after the first position whose hidden
    /// state was kept, and those hidden states `(1, T, H)`.
    prompt: Option<(Vec<u32>, Array)>,
}

/// A draft model with its own caches, which hold the sequence up to `unfed`.
struct DraftModel<'a> {
    model: &'a dyn LanguageModel,
    caches: Vec<KvCache>,
    /// Tokens of the sequence the draft model has not run yet.
    unfed: Vec<u32>,
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
        let source = match spec.method {
            Drafts::PromptLookup => Source::Lookup {
                history: prompt.to_vec(),
            },
            Drafts::DraftModel => {
                // `Engine::generate` refused the request when no draft model is loaded.
                let Some(model) = dec.ctx.draft else {
                    return Ok(None);
                };
                let caches = model.make_caches();
                if !caches.iter().all(|c| matches!(c, KvCache::Standard(_))) {
                    return Ok(None);
                }
                let mut draft = DraftModel {
                    model,
                    caches,
                    unfed: Vec::new(),
                };
                draft.prefill(prompt, &dec.ctx, cancel)?;
                Source::Model(draft)
            }
            Drafts::Mtp => match MtpDraft::new(dec.ctx.model, prompt, hidden)? {
                Some(mtp) => Source::Mtp(mtp),
                None => return Ok(None),
            },
        };
        let depth = dec.ctx.model.mtp_depth();
        let num_draft_tokens = (spec.num_draft_tokens).unwrap_or(spec.method.default_count(depth));
        Ok(Some(Self {
            source,
            num_draft_tokens,
            last: Vec::new(),
            drafted: 0,
            accepted: 0,
        }))
    }

    /// Up to `limit` (and `num_draft_tokens`) tokens to follow the sequence.
    fn draft(&mut self, limit: usize) -> Result<Vec<u32>> {
        let limit = limit.min(self.num_draft_tokens);
        self.last = match &mut self.source {
            Source::Lookup { history } => lookup(history, limit),
            Source::Model(draft) => draft.draft(limit)?,
            Source::Mtp(mtp) => mtp.draft(limit)?,
        };
        self.drafted += self.last.len();
        Ok(self.last.clone())
    }

    /// Only the first `n` tokens of the last draft are verified (a constraint refused the rest).
    fn cut(&mut self, n: usize) {
        self.drafted -= self.last.len() - n;
    }

    /// Whether drafting needs the model's final hidden states of the verification pass.
    fn reads_hidden(&self) -> bool {
        matches!(self.source, Source::Mtp(_))
    }

    /// The first `accepted` tokens of the last draft were taken, then `next`; `hidden`: the
    /// verification pass's hidden states, when [`Self::reads_hidden`].
    fn taken(&mut self, accepted: usize, next: u32, hidden: Option<&Array>) -> Result<()> {
        self.accepted += accepted;
        let draft = std::mem::take(&mut self.last);
        match &mut self.source {
            Source::Lookup { history } => {
                history.extend(&draft[..accepted]);
                history.push(next);
            }
            Source::Model(model) => model.taken(&draft, accepted, next),
            Source::Mtp(mtp) => mtp.taken(&draft, accepted, next, hidden)?,
        }
        Ok(())
    }
}

/// Up to `limit` tokens that followed the latest earlier occurrence of the history's last `n`
/// tokens, for the longest `n` (at most [`MAX_NGRAM`]) that occurs earlier at all.
fn lookup(h: &[u32], limit: usize) -> Vec<u32> {
    for n in (1..=MAX_NGRAM.min(h.len().saturating_sub(1))).rev() {
        let tail = &h[h.len() - n..];
        let found = (0..h.len() - n).rev().find(|&i| &h[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            return h[from..(from + limit).min(h.len())].to_vec();
        }
    }
    Vec::new()
}

impl DraftModel<'_> {
    /// Runs all of `prompt` but its last token, in chunks, checking for cancellation.
    fn prefill(
        &mut self,
        prompt: &[u32],
        ctx: &GenerationContext<'_>,
        cancel: &CancelToken,
    ) -> Result<()> {
        let (rest, last) = prompt.split_at(prompt.len() - 1);
        for part in rest.chunks(ctx.prefill_chunk) {
            if ctx.cancelled(cancel)? {
                break;
            }
            let input = Array::from_slice(part, &[1, part.len() as i32]);
            (self.model).forward(Input::tokens(&input), Caches::One(&mut self.caches))?;
            transforms::eval(self.caches.iter().flat_map(KvCache::arrays))?;
        }
        self.unfed = last.to_vec();
        Ok(())
    }

    /// `limit` tokens, each the draft model's most likely next one (the last is not run).
    fn draft(&mut self, limit: usize) -> Result<Vec<u32>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let unfed = std::mem::take(&mut self.unfed);
        let mut input = Array::from_slice(&unfed, &[1, unfed.len() as i32]);
        let mut tokens = Vec::with_capacity(limit);
        for i in 0..limit {
            let logits =
                (self.model).forward(Input::tokens(&input), Caches::One(&mut self.caches))?;
            let last = logits.take_axis(Array::from_int(logits.dim(1) - 1), 1)?;
            let token = ops::indexing::argmax_axis(&last, -1, None)?;
            if i + 1 < limit {
                input = token.reshape(&[1, 1])?;
                transforms::async_eval([&input])?;
            }
            tokens.push(token);
        }
        transforms::eval(&tokens)?;
        Ok(tokens.iter().map(|t| t.item_exact::<u32>()).collect())
    }

    /// After `draft` (all but its last token run), `accepted` of it and then `next` were taken.
    fn taken(&mut self, draft: &[u32], accepted: usize, next: u32) {
        if let Some(&last) = draft.last() {
            if accepted == draft.len() {
                self.unfed.push(last);
            } else {
                let run_but_rejected = draft.len() - 1 - accepted;
                for cache in &mut self.caches {
                    cache.trim(run_but_rejected as i32);
                }
            }
        }
        self.unfed.push(next);
    }
}

impl<'a> MtpDraft<'a> {
    /// The head of `model`, to be prefilled (at the first token taken) with `prompt`'s hidden
    /// states `hidden` (from the first position kept on, as [`SequenceState::hidden`] holds
    /// them); `None` when the model has no head or they do not reach the prompt's end (then
    /// the request runs one token per pass).
    fn new(
        model: &'a dyn LanguageModel,
        prompt: &[u32],
        hidden: Option<(usize, Vec<Array>)>,
    ) -> Result<Option<Self>> {
        let Some((start, chunks)) = hidden.filter(|(_, c)| !c.is_empty()) else {
            return Ok(None);
        };
        let hidden = ops::concatenate(&chunks, 1)?;
        if model.mtp_depth() == 0 || start + hidden.dim(1) as usize != prompt.len() {
            return Ok(None);
        }
        Ok(Some(Self {
            model,
            caches: model.mtp_caches(),
            seed: None,
            appended: 0,
            prompt: Some((prompt[start + 1..].to_vec(), hidden)),
        }))
    }

    /// `limit` tokens: the head's guess after the last token taken, then its guesses chained
    /// on its own hidden states (mlx-vlm's `draft_block`, greedy).
    fn draft(&mut self, limit: usize) -> Result<Vec<u32>> {
        self.appended = 0;
        let Some((mut token, mut hidden)) = self.seed.clone().filter(|_| limit > 0) else {
            return Ok(Vec::new());
        };
        let mut tokens = vec![token.clone()];
        while tokens.len() < limit {
            let (logits, h) = (self.model).mtp_forward(&token, &hidden, &mut self.caches)?;
            self.appended += 1;
            token = ops::indexing::argmax_axis(&logits, -1, None)?;
            hidden = h;
            tokens.push(token.clone());
        }
        transforms::eval(&tokens)?;
        Ok(tokens.iter().map(|t| t.item_exact::<u32>()).collect())
    }

    /// After `draft`, `accepted` of it then `next` were taken: the head's positions run on its
    /// own (wrong) hidden states past the accepted ones are trimmed, and it runs the accepted
    /// rest and `next` beside the model's hidden states `hidden` `(1, k + 1, H)` of the
    /// verification (mlx-vlm's `accept_verified_tokens`), which gives the next seed.
    fn taken(
        &mut self,
        draft: &[u32],
        accepted: usize,
        next: u32,
        hidden: Option<&Array>,
    ) -> Result<()> {
        let (tokens, hidden) = match (self.prompt.take(), hidden) {
            (Some((mut tokens, hidden)), _) => {
                tokens.push(next);
                (tokens, hidden)
            }
            (None, Some(verified)) => {
                let keep = accepted.min(self.appended);
                for cache in &mut self.caches {
                    cache.trim((self.appended - keep) as i32);
                }
                let tokens = [&draft[keep..accepted], &[next]].concat();
                let rows = ops::arange::<_, i32>(keep as i32, accepted as i32 + 1, 1)?;
                (tokens, verified.take_axis(&rows, 1)?)
            }
            (None, None) => {
                return Err(mlx_rs::error::Exception::custom(
                    "a multi-token-prediction draft needs the model's hidden states",
                )
                .into())
            }
        };
        self.appended = 0;
        let input = Array::from_slice(&tokens, &[1, tokens.len() as i32]);
        let (logits, h) = (self.model).mtp_forward(&input, &hidden, &mut self.caches)?;
        let last = Array::from_int(h.dim(1) - 1);
        let token = ops::indexing::argmax_axis(&logits.take_axis(&last, 1)?, -1, None)?;
        let token = token.reshape(&[1, 1])?;
        let h = h.take_axis(&last, 1)?.expand_dims(1)?;
        transforms::async_eval([&token, &h])?;
        self.seed = Some((token, h));
        Ok(())
    }
}

/// A verification pass: the step sampled at each position, the penalty history each had, and
/// (when asked) the model's final hidden states `(1, k + 1, H)`.
struct Verified {
    steps: Vec<Step>,
    recents: Vec<Option<Array>>,
    hidden: Option<Array>,
}

impl SequenceState<'_> {
    /// Whether draft positions can be taken back: every cache a plain KV cache or a recurrent
    /// state (which records the verification's steps; not a sliding-window ring or a quantized
    /// cache), no explicit rotary positions. A constraint can: its grammar follows a draft and
    /// rolls back.
    fn can_speculate(&self) -> bool {
        self.positions.is_none()
            && self.ctx.kv_bits.is_none()
            && self.caches.iter().all(KvCache::can_take_back)
    }

    /// Runs `tokens` through the model in one pass and samples at every position, each with the
    /// penalty history it would have had as a single step and the constraint's mask there
    /// (`masks[i]` at position `i`; a position past them is never taken); with `hidden`, the
    /// model's hidden states too.
    fn verify(&mut self, tokens: &[u32], masks: Vec<Array>, hidden: bool) -> Result<Verified> {
        self.caches.iter_mut().for_each(KvCache::record_steps);
        let input = Array::from_slice(tokens, &[tokens.len() as i32]);
        let (logits, hidden) = self.run(&input, None, hidden)?;
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

/// Decodes from `first` (the prompt's next token, evaluated) with drafts from `drafter`: the
/// finish reason and how many tokens were taken before it.
pub(super) fn decode(
    dec: &mut SequenceState<'_>,
    req: &GenerateRequest,
    drafter: &mut Drafter<'_>,
    first: Step,
    out: &mut Output<'_>,
    on_delta: &mut dyn FnMut(Delta),
    cancel: &CancelToken,
) -> Result<(FinishReason, usize)> {
    let (mut pending, mut accepted, mut hidden) = (vec![first], 0, None);
    let (mut n, mut since_clear) = (0usize, 0usize);
    loop {
        for step in &pending {
            if dec.ctx.cancelled(cancel)? {
                return Ok((FinishReason::Cancelled, n));
            }
            if n == req.max_new_tokens {
                return Ok((FinishReason::Length, n));
            }
            if let Some(finish) = dec.take(step, out, on_delta)? {
                return Ok((finish, n));
            }
            n += 1;
        }
        // The last token is taken but not yet run.
        let last = *dec.sampled.last().expect("a token was taken");
        drafter.taken(accepted, last, hidden.as_ref())?;
        if dec.ctx.cancelled(cancel)? {
            return Ok((FinishReason::Cancelled, n));
        }
        if n == req.max_new_tokens {
            return Ok((FinishReason::Length, n));
        }
        since_clear += pending.len();
        if since_clear >= CLEAR_CACHE_EVERY {
            mlx_rs::memory::clear_cache()?;
            since_clear = 0;
        }
        // The token after the last draft must fit in max_new_tokens too.
        let mut draft = drafter.draft(req.max_new_tokens - n - 1)?;
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
            steps,
            mut recents,
            hidden: verified,
        } = dec.verify(&tokens, masks, drafter.reads_hidden())?;
        hidden = verified;
        transforms::eval(steps.iter().map(|s| &s.token))?;
        accepted = (draft.iter().zip(&steps))
            .take_while(|(d, s)| s.token.item_exact::<u32>() == **d)
            .count();
        dec.rewind(draft.len() - accepted)?;
        dec.recent = recents.swap_remove(accepted);
        pending = steps;
        pending.truncate(accepted + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::lookup as draft;

    #[test]
    fn drafts_what_followed_the_latest_earlier_match_of_the_longest_suffix() {
        // "3 4" occurred before, followed by 5 6 7.
        assert_eq!(draft(&[1, 2, 3, 4, 5, 6, 7, 9, 3, 4], 3), vec![5, 6, 7]);
        // The longer suffix "2 3 4" wins over the later "3 4".
        assert_eq!(draft(&[2, 3, 4, 8, 0, 3, 4, 9, 2, 3, 4], 2), vec![8, 0]);
        // Of two matches of the same length, the latest.
        assert_eq!(draft(&[7, 1, 7, 2, 7], 1), vec![2]);
        // The draft stops at the end of the history.
        assert_eq!(draft(&[5, 6, 5], 4), vec![6, 5]);
    }

    #[test]
    fn nothing_to_draft_without_a_match() {
        assert!(draft(&[1, 2, 3, 4], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[], 4).is_empty());
    }
}
