//! Speculative decoding by prompt lookup: the tokens that followed an earlier occurrence of the
//! sequence's last few tokens (in the prompt or the output) are drafted, and one forward pass
//! over the last token and the draft gives the model's own choice at every position. The
//! choices are taken while they agree with the draft, plus the first that does not (or one past
//! the draft): every token is still the model's, sampled with the request's sampler from the
//! logits of the sequence before it (mlx-lm's acceptance rule), so greedy output is that of
//! one-token steps, up to float differences between a pass over several positions and one.
//! The cache positions of rejected draft tokens are trimmed away.

use mlx_rs::{transforms, Array};

use super::{Decoder, Output, Result, Step, CLEAR_CACHE_EVERY};
use crate::{
    kv_cache::KvCache,
    request::{Delta, FinishReason, GenerateRequest},
    CancelToken,
};

/// The longest suffix of the sequence looked up in it; shorter ones are tried after.
const MAX_NGRAM: usize = 3;

/// Drafts from the sequence itself, and how many were drafted and accepted.
pub(super) struct PromptLookup {
    /// The prompt, then every token generated so far.
    history: Vec<u32>,
    num_draft_tokens: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl PromptLookup {
    pub fn new(prompt: &[u32], num_draft_tokens: usize) -> Self {
        Self {
            history: prompt.to_vec(),
            num_draft_tokens,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Up to `limit` tokens that followed the latest earlier occurrence of the history's last
    /// `n` tokens, for the longest `n` (at most [`MAX_NGRAM`]) that occurs earlier at all.
    fn draft(&self, limit: usize) -> Vec<u32> {
        let h = &self.history;
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
}

impl Decoder<'_> {
    /// Whether draft positions can be taken back: every cache a plain KV cache (not a
    /// sliding-window ring, a quantized cache or a recurrent state), no constraint (its mask
    /// needs each token before the next), no explicit rotary positions.
    pub(super) fn can_speculate(&self) -> bool {
        self.guide.is_none()
            && self.positions.is_none()
            && self.ctx.kv_bits.is_none()
            && self
                .caches
                .iter()
                .all(|c| matches!(c, KvCache::Standard(_)))
    }

    /// Runs `tokens` through the model in one pass and samples at every position, each with the
    /// penalty history it would have had as a single step. Returns the steps and those histories.
    fn verify(&mut self, tokens: &[u32]) -> Result<(Vec<Step>, Vec<Option<Array>>)> {
        let logits = self.forward(&Array::from_slice(tokens, &[tokens.len() as i32]), None)?;
        let mut steps = Vec::with_capacity(tokens.len());
        let mut recents = Vec::with_capacity(tokens.len());
        for (i, &token) in tokens.iter().enumerate() {
            let row = logits.take_axis(Array::from_int(i as i32), 1)?;
            self.remember(&Array::from_slice(&[token], &[1]))?;
            steps.push(self.sample(row, None)?);
            recents.push(self.recent.clone());
        }
        Ok((steps, recents))
    }

    /// Forgets the last `n` positions fed to the model.
    fn rewind(&mut self, n: usize) {
        for cache in &mut self.caches {
            cache.trim(n as i32);
        }
        self.next -= n;
    }
}

/// Decodes from `first` (the prompt's next token, evaluated) with drafts from `drafts`: the
/// finish reason and how many tokens were taken before it.
pub(super) fn decode(
    dec: &mut Decoder<'_>,
    req: &GenerateRequest,
    drafts: &mut PromptLookup,
    first: Step,
    out: &mut Output<'_>,
    on_delta: &mut dyn FnMut(Delta),
    cancel: &CancelToken,
) -> Result<(FinishReason, usize)> {
    let mut pending = vec![first];
    let (mut n, mut since_clear) = (0usize, 0usize);
    loop {
        for step in &pending {
            if cancel.is_cancelled() {
                return Ok((FinishReason::Cancelled, n));
            }
            if n == req.max_new_tokens {
                return Ok((FinishReason::Length, n));
            }
            if let Some(finish) = dec.take(step, out, on_delta)? {
                return Ok((finish, n));
            }
            drafts
                .history
                .push(*dec.sampled.last().expect("just taken"));
            n += 1;
        }
        if n == req.max_new_tokens || cancel.is_cancelled() {
            continue;
        }
        since_clear += pending.len();
        if since_clear >= CLEAR_CACHE_EVERY {
            mlx_rs::memory::clear_cache()?;
            since_clear = 0;
        }
        // The last token is taken but not yet run; the bonus token must fit in max_new_tokens.
        let last = *drafts.history.last().expect("a token was taken");
        let limit = drafts.num_draft_tokens.min(req.max_new_tokens - n - 1);
        let draft = drafts.draft(limit);
        let tokens: Vec<u32> = std::iter::once(last).chain(draft.iter().copied()).collect();
        let (steps, mut recents) = dec.verify(&tokens)?;
        transforms::eval(steps.iter().map(|s| &s.token))?;
        let accepted = (draft.iter().zip(&steps))
            .take_while(|(d, s)| s.token.item_exact::<u32>() == **d)
            .count();
        dec.rewind(draft.len() - accepted);
        dec.recent = recents.swap_remove(accepted);
        drafts.drafted += draft.len();
        drafts.accepted += accepted;
        pending = steps;
        pending.truncate(accepted + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::PromptLookup;

    fn draft(history: &[u32], limit: usize) -> Vec<u32> {
        PromptLookup::new(history, limit).draft(limit)
    }

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
