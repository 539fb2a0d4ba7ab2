//! Where drafts come from: the sequence itself (prompt lookup), a draft model with its own
//! caches, the model's own multi-token-prediction head or an EAGLE-3 drafter (chaining
//! guesses), a DFlash, DFlash2 or DSpark block drafter. Model drafters
//! pick each token greedily, or draw it from their distribution when the request samples
//! ([`pick`]).

use mlx_rs::{ops, ops::indexing::IndexOp, transforms, Array};

use super::{context::GenerationContext, context::Result, state::HiddenSink};
use crate::{
    layers::kv_cache::Caches,
    layers::kv_cache::KvCache,
    models::{DFlash, Eagle3, Input, LanguageModel, Proposer},
    runtime::sampler::{log_softmax, Sampler},
    CancelToken,
};

/// The longest suffix of the sequence looked up in it; shorter ones are tried after.
const MAX_NGRAM: usize = 3;

/// A drafter that guesses from the token before and a hidden state, chaining guesses on its
/// own hidden states: the model's own multi-token-prediction head (mlx-vlm's MTP drafter) or an
/// EAGLE-3 drafter beside it. Its caches hold a position for every token taken whose preceding
/// hidden state the model gave.
pub(super) struct ChainDraft<'a> {
    model: &'a dyn LanguageModel,
    head: Head<'a>,
    caches: Vec<KvCache>,
    /// The head's logits `(1, V)` for the token after the last one taken, and its own hidden
    /// state there `(1, 1, H)`, from which it chains.
    seed: Option<(Array, Array)>,
    /// Positions the head ran while drafting the last draft (on its own hidden states).
    appended: usize,
    /// Until the first token is taken: the prompt tokens after the first position whose hidden
    /// state was kept, and those hidden states `(1, T, H)`.
    prompt: Option<(Vec<u32>, Array)>,
}

/// What a [`ChainDraft`] runs.
enum Head<'a> {
    /// The model's own multi-token-prediction head (`LanguageModel::mtp_forward`).
    Mtp,
    Eagle3(&'a Eagle3),
}

/// A draft model with its own caches, which hold the sequence up to `unfed`.
pub(super) struct DraftModel<'a> {
    model: &'a dyn LanguageModel,
    caches: Vec<KvCache>,
    /// Tokens of the sequence the draft model has not run yet.
    unfed: Vec<u32>,
}

/// Up to `limit` tokens that followed the latest earlier occurrence of the history's last `n`
/// tokens, for the longest `n` (at most [`MAX_NGRAM`]) that occurs earlier at all.
pub(super) fn lookup(h: &[u32], limit: usize) -> Vec<u32> {
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

/// A draft token `(1,)` from drafter logits `(1, V)`: the most likely one, or, when the request
/// samples (`q` given), one drawn from the drafter's distribution under the request's filters and
/// temperature, whose log-probabilities `(1, V)` go to `q` for the acceptance rule
/// (`acceptance.rs`).
pub(super) fn pick(
    logits: &Array,
    sampler: &mut Sampler,
    q: Option<&mut Vec<Array>>,
) -> Result<Array> {
    let Some(q) = q else {
        return Ok(ops::indexing::argmax_axis(logits, -1, None)?);
    };
    let distribution = sampler.distribution(&log_softmax(logits)?)?;
    let token = sampler.draw(&distribution)?;
    q.push(distribution);
    Ok(token)
}

impl<'a> DraftModel<'a> {
    /// A draft model with the prompt cache's caches `kept` (holding a prefix of the prompt) or
    /// fresh ones; `None` when they cannot take positions back.
    pub(super) fn new(model: &'a dyn LanguageModel, kept: Option<Vec<KvCache>>) -> Option<Self> {
        let caches = kept.unwrap_or_else(|| model.make_caches());
        (caches.iter().all(|c| matches!(c, KvCache::Standard(_)))).then_some(Self {
            model,
            caches,
            unfed: Vec::new(),
        })
    }

    /// Positions its caches hold.
    pub(super) fn held(&self) -> usize {
        held(&self.caches)
    }

    /// Runs all of `prompt` but its last token (past what its caches hold), in chunks,
    /// checking for cancellation.
    pub(super) fn prefill(
        &mut self,
        prompt: &[u32],
        ctx: &GenerationContext<'_>,
        cancel: &CancelToken,
    ) -> Result<()> {
        let (rest, last) = prompt.split_at(prompt.len() - 1);
        let rest = &rest[self.held().min(rest.len())..];
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

    /// `limit` tokens, each the draft model's pick ([`pick`]) for the next (the last is not run).
    pub(super) fn draft(
        &mut self,
        limit: usize,
        sampler: &mut Sampler,
        mut q: Option<&mut Vec<Array>>,
    ) -> Result<Vec<u32>> {
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
            let token = pick(&last, sampler, q.as_deref_mut())?;
            if i + 1 < limit {
                input = token.reshape(&[1, 1])?;
                transforms::async_eval([&input])?;
            }
            tokens.push(token);
        }
        transforms::eval(&tokens)?;
        Ok(tokens.iter().map(|t| t.item_exact::<u32>()).collect())
    }

    /// Its caches for the prompt cache, holding what the model's hold: every token taken but
    /// the last.
    pub(super) fn into_caches(mut self) -> Result<Vec<KvCache>> {
        if let [behind @ .., _] = &self.unfed[..] {
            if !behind.is_empty() {
                let input = Array::from_slice(behind, &[1, behind.len() as i32]);
                (self.model).forward(Input::tokens(&input), Caches::One(&mut self.caches))?;
            }
        }
        self.unfed.clear();
        Ok(self.caches)
    }

    /// After `draft` (all but its last token run), `accepted` of it and then `next` were taken.
    pub(super) fn taken(&mut self, draft: &[u32], accepted: usize, next: u32) {
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

impl<'a> ChainDraft<'a> {
    /// The multi-token-prediction head of `model` (`eagle3`: none), or the EAGLE-3 drafter
    /// `eagle3` beside it, to be prefilled (at the first token taken) with `prompt`'s hidden
    /// states `hidden` (from the first position kept on, as [`SequenceState::hidden`] holds
    /// them); `None` when the model has no head or they do not reach the prompt's end (then
    /// the request runs one token per pass).
    pub(super) fn new(
        model: &'a dyn LanguageModel,
        eagle3: Option<&'a Eagle3>,
        prompt: &[u32],
        (hidden, kept): (Option<HiddenSink>, Option<Vec<KvCache>>),
    ) -> Result<Option<Self>> {
        if eagle3.is_none() && model.mtp_depth() == 0 {
            return Ok(None);
        }
        let Some(hidden) = joined(prompt, hidden)? else {
            return Ok(None);
        };
        let start = prompt.len() - hidden.dim(1) as usize;
        let (head, fresh) = match eagle3 {
            Some(drafter) => (Head::Eagle3(drafter), drafter.caches()),
            None => (Head::Mtp, model.mtp_caches()),
        };
        // The prompt cache's, when they hold the positions before the first one prefilled.
        let caches = kept.filter(|c| held(c) == start).unwrap_or(fresh);
        Ok(Some(Self {
            model,
            head,
            caches,
            seed: None,
            appended: 0,
            prompt: Some((prompt[start + 1..].to_vec(), hidden)),
        }))
    }

    /// Positions its caches hold.
    pub(super) fn held(&self) -> usize {
        held(&self.caches)
    }

    /// Its caches for the prompt cache (after the last [`Self::taken`], the model's positions).
    pub(super) fn into_caches(self) -> Vec<KvCache> {
        self.caches
    }

    /// Whether it is the model's own head (else an EAGLE-3 drafter).
    pub(super) fn is_mtp(&self) -> bool {
        matches!(self.head, Head::Mtp)
    }

    /// `limit` tokens: the head's pick ([`pick`]) after the last token taken, then its picks
    /// chained on its own hidden states (mlx-vlm's `draft_block`).
    pub(super) fn draft(
        &mut self,
        limit: usize,
        sampler: &mut Sampler,
        mut q: Option<&mut Vec<Array>>,
    ) -> Result<Vec<u32>> {
        self.appended = 0;
        let Some((logits, mut hidden)) = self.seed.clone().filter(|_| limit > 0) else {
            return Ok(Vec::new());
        };
        let mut token = pick(&logits, sampler, q.as_deref_mut())?.reshape(&[1, 1])?;
        let mut tokens = vec![token.clone()];
        while tokens.len() < limit {
            let (logits, h) = self.run(&token, &hidden)?;
            self.appended += 1;
            let logits = logits.take_axis(Array::from_int(0), 1)?;
            token = pick(&logits, sampler, q.as_deref_mut())?.reshape(&[1, 1])?;
            hidden = h;
            tokens.push(token.clone());
        }
        transforms::eval(&tokens)?;
        Ok(tokens.iter().map(|t| t.item_exact::<u32>()).collect())
    }

    /// After `draft`, `accepted` of it then `next` were taken: the head's positions run on its
    /// own (wrong) hidden states past the accepted ones are trimmed (EAGLE-3's: all of them,
    /// as mlx-vlm's drafter trims), and it runs the accepted rest and `next` beside the model's
    /// hidden states `hidden` `(1, k + 1, H)` of the verification (mlx-vlm's
    /// `accept_verified_tokens`), which gives the next seed.
    pub(super) fn taken(
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
                let keep = match self.head {
                    Head::Mtp => accepted.min(self.appended),
                    Head::Eagle3(_) => 0,
                };
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
        let (logits, h) = self.run(&input, &hidden)?;
        let last = Array::from_int(h.dim(1) - 1);
        let logits = logits.take_axis(&last, 1)?;
        let h = h.take_axis(&last, 1)?.expand_dims(1)?;
        transforms::async_eval([&logits, &h])?;
        self.seed = Some((logits, h));
        Ok(())
    }
}

impl ChainDraft<'_> {
    /// The head over `tokens` `(1, L)` beside hidden states `hidden` `(1, L, _)`: its logits
    /// `(1, L, V)` over the model's vocabulary and its own hidden states `(1, L, H)`.
    fn run(&mut self, tokens: &Array, hidden: &Array) -> Result<(Array, Array)> {
        let Head::Eagle3(drafter) = self.head else {
            return Ok((self.model).mtp_forward(tokens, hidden, &mut self.caches)?);
        };
        let embeds = match drafter.embedding() {
            Some(table) => table.forward(tokens)?,
            None => self.model.embed(tokens)?,
        };
        let h = drafter.forward(&embeds, hidden, &mut self.caches)?;
        let vocab = self.model.facts().embedding_rows;
        Ok((drafter.logits(&h, vocab)?, h))
    }
}

/// Positions `caches` hold.
fn held(caches: &[KvCache]) -> usize {
    caches.first().map_or(0, |c| c.offset().max(0) as usize)
}

/// The prompt's hidden states the prefill kept in `sink`, joined `(1, S, _)`, when they reach
/// its end (a prefill run elsewhere kept none).
fn joined(prompt: &[u32], sink: Option<HiddenSink>) -> Result<Option<Array>> {
    let Some(sink) = sink.filter(|s| !s.chunks.is_empty()) else {
        return Ok(None);
    };
    let hidden = ops::concatenate(&sink.chunks, 1)?;
    Ok((sink.start + hidden.dim(1) as usize == prompt.len()).then_some(hidden))
}

/// A DFlash block drafter beside the model: its caches hold the context (the model's hidden
/// states at the drafter's layers) of every token taken whose hidden states the model gave.
pub(super) struct BlockDraft<'a> {
    model: &'a dyn LanguageModel,
    drafter: &'a DFlash,
    caches: Vec<KvCache>,
    /// The context of the positions taken since the last draft `(1, S, layers * H)`.
    context: Option<Array>,
    /// The last token taken, which the model has not run yet.
    last: u32,
    /// Until the first token is taken: the prompt's context.
    prompt: Option<Array>,
}

impl<'a> BlockDraft<'a> {
    /// The drafter over the prompt's context the prefill kept in `hidden`; `None` when it does
    /// not reach the prompt's end (then nothing is drafted).
    pub(super) fn new(
        model: &'a dyn LanguageModel,
        drafter: &'a DFlash,
        prompt: &[u32],
        (hidden, kept): (Option<HiddenSink>, Option<Vec<KvCache>>),
    ) -> Result<Option<Self>> {
        let Some(context) = joined(prompt, hidden)? else {
            return Ok(None);
        };
        // The prompt cache's, when they hold the context before the first position prefilled.
        let start = prompt.len() - context.dim(1) as usize;
        let caches = kept.filter(|c| held(c) == start);
        Ok(Some(Self {
            model,
            drafter,
            caches: caches.unwrap_or_else(|| drafter.caches()),
            context: None,
            last: 0,
            prompt: Some(context),
        }))
    }

    pub(super) fn block_size(&self) -> usize {
        self.drafter.block_size
    }

    /// Positions its caches hold.
    pub(super) fn held(&self) -> usize {
        held(&self.caches)
    }

    /// Its caches for the prompt cache: the context of the positions taken since the last
    /// draft joins them, so they hold the model's positions.
    pub(super) fn into_caches(mut self) -> Result<Vec<KvCache>> {
        if let Some(context) = self.context.take() {
            self.drafter.remember(&context, &mut self.caches)?;
        }
        Ok(self.caches)
    }

    /// `limit` guesses in one pass of the drafter (mlx-vlm's `draft_block`): the block is the
    /// last token taken and mask tokens ([`DFlash::block`]); each guess is picked ([`pick`])
    /// from its logits, among DFlash2's candidates or after DSpark's Markov step.
    pub(super) fn draft(
        &mut self,
        limit: usize,
        sampler: &mut Sampler,
        mut q: Option<&mut Vec<Array>>,
    ) -> Result<Vec<u32>> {
        // Without a guess to make, the context waits for the next draft.
        if limit == 0 {
            return Ok(Vec::new());
        }
        let Some(context) = self.context.take() else {
            return Ok(Vec::new());
        };
        let (drafter, model) = (self.drafter, self.model);
        let block = drafter.block(self.last, limit);
        let block = Array::from_slice(&block, &[1, block.len() as i32]);
        let h = drafter.forward(&drafter.embed(model, &block)?, &context, &mut self.caches)?;
        let h = h.index((.., drafter.guess_positions(limit), ..));
        let logits = drafter.logits(model, &h)?;
        let row = |i: usize| logits.take_axis(Array::from_int(i as i32), 1);
        let mut previous = Array::from_slice(&[self.last], &[1]);
        let mut tokens = Vec::with_capacity(limit);
        match &drafter.proposer {
            // Greedy: every guess in one argmax; drawn: one draw (and its odds) per position.
            Proposer::Head if q.is_none() => {
                tokens.push(ops::indexing::argmax_axis(&logits, -1, None)?.reshape(&[-1])?)
            }
            Proposer::Head => {
                for i in 0..limit {
                    tokens.push(pick(&row(i)?, sampler, q.as_deref_mut())?);
                }
            }
            Proposer::Markov(markov) => {
                for i in 0..limit {
                    previous = pick(
                        &markov.step(&row(i)?, &previous)?,
                        sampler,
                        q.as_deref_mut(),
                    )?;
                    tokens.push(previous.clone());
                }
            }
            // The selector's scores over its candidates; drawn, as logits over the whole
            // vocabulary that leave every other token out, so that the odds are the vocabulary's.
            Proposer::Selector(selector) => {
                let candidates = selector.candidates(&h, &logits)?;
                for i in 0..limit as i32 {
                    let scores = selector.scores(&candidates, i, &previous)?;
                    let among = candidates.tokens.index(i..i + 1);
                    previous = match q.as_deref_mut() {
                        None => {
                            let best = ops::indexing::argmax_axis(&scores, -1, Some(true))?;
                            among.take_along_axis(&best, -1)?.reshape(&[1])?
                        }
                        Some(q) => {
                            let none = ops::full::<f32>(
                                &[1, logits.dim(-1)],
                                Array::from_f32(f32::NEG_INFINITY),
                            )?
                            .as_dtype(scores.dtype())?;
                            let row = none.put_along_axis(&among, &scores, -1)?;
                            pick(&row, sampler, Some(q))?
                        }
                    };
                    tokens.push(previous.clone());
                }
            }
        }
        let tokens = ops::concatenate(&tokens, 0)?;
        tokens.eval()?;
        Ok(tokens.as_slice::<u32>().to_vec())
    }

    /// `accepted` of the last draft, then `next`, were taken: the context of the positions
    /// taken is the verification pass's `hidden` `(1, k + 1, _)` up to the last accepted
    /// (mlx-vlm's `hidden[:, :accepted + 1]`); the first time, the prompt's.
    pub(super) fn taken(
        &mut self,
        accepted: usize,
        next: u32,
        hidden: Option<&Array>,
    ) -> Result<()> {
        let taken = match (self.prompt.take(), hidden) {
            (Some(prompt), _) => prompt,
            (None, Some(verified)) => {
                let rows = ops::arange::<_, i32>(0, accepted as i32 + 1, 1)?;
                verified.take_axis(&rows, 1)?
            }
            (None, None) => {
                return Err(mlx_rs::error::Exception::custom(
                    "a block draft needs the model's hidden states",
                )
                .into())
            }
        };
        // After a round without a draft, the context still waiting comes first.
        self.context = Some(match self.context.take() {
            Some(waiting) => ops::concatenate(&[waiting, taken], 1)?,
            None => taken,
        });
        self.last = next;
        Ok(())
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
