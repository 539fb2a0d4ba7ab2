//! The prompt cache: a resident model keeps the KV caches of its recent generations (several
//! conversations, least recently used first out, bounded in bytes) and the tokens they hold;
//! the next generation whose prompt starts with the same tokens as one of them (a chat's next
//! turn) prefills only the rest. `usage.cached_tokens` reports the reuse.
//!
//! A prompt takes the entry sharing its longest prefix. Reused caches are cut back to the
//! shared prefix (at most the prompt minus its last token, which must run to give the first
//! logits). An entry the prompt extends whole is moved out (the generation's caches replace
//! it); one it shares only a part of is copied and the copy cut back, so the other
//! conversation keeps its entry (copies share MLX arrays until written). A cache that cannot
//! be cut back (a sliding-window ring that has wrapped; a linear-attention layer's recurrent
//! state, reused whole when the new prompt extends the kept tokens, else from a snapshot of it
//! taken at an earlier position) or that was made with the adapter in the other position is
//! not reused.

use crate::layers::kv_cache::{KvCache, Snapshot};

/// The default byte budget of a resident's prompt cache (`--prompt-cache-bytes`).
pub const DEFAULT_PROMPT_CACHE_BYTES: u64 = 1 << 30;

pub(crate) struct PromptCache {
    /// Least recently used first.
    entries: Vec<Kept>,
    /// Bytes the entries may hold together; the newest entry is kept even past it.
    budget: u64,
}

struct Kept {
    caches: Vec<KvCache>,
    /// The tokens the caches hold, in order.
    tokens: Vec<u32>,
    /// A hybrid model's recurrent states at earlier positions (ascending), where a prompt that
    /// leaves `tokens` can resume.
    snapshots: Vec<Snapshot>,
    /// Whether the adapter (if any) was on when they were computed.
    adapter_on: bool,
}

impl Kept {
    /// How many leading tokens of `prompt` this entry could give (0 if none).
    fn shared(&self, prompt: &[u32], adapter_on: bool) -> usize {
        if self.adapter_on != adapter_on {
            return 0;
        }
        let shared = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b);
        shared.count().min(prompt.len().saturating_sub(1))
    }

    fn bytes(&self) -> u64 {
        let arrays = self.caches.iter().flat_map(KvCache::arrays);
        let snapshots: u64 = self.snapshots.iter().map(Snapshot::bytes).sum();
        arrays.map(|a| a.nbytes() as u64).sum::<u64>() + snapshots
    }
}

impl Default for PromptCache {
    fn default() -> Self {
        Self::new(DEFAULT_PROMPT_CACHE_BYTES)
    }
}

impl PromptCache {
    pub fn new(budget: u64) -> Self {
        Self {
            entries: Vec::new(),
            budget,
        }
    }

    /// Caches for generating from `prompt`: a kept entry's cut back to the longest prefix it
    /// shares with it (for a hybrid model whose states cannot be cut back, to its latest
    /// snapshot within that prefix), or fresh ones. Returns them, how many prompt tokens they
    /// already hold, and the entry's snapshots within those (still prefixes of the prompt).
    /// With `lend`, an entry the prompt extends whole lends a copy too (the generation will not
    /// be kept in its place).
    pub fn take(
        &mut self,
        prompt: &[u32],
        (adapter_on, lend): (bool, bool),
        make_caches: impl FnOnce() -> Vec<KvCache>,
    ) -> (Vec<KvCache>, usize, Vec<Snapshot>) {
        let Some((shared, i, copies)) = self.reuse(prompt, (adapter_on, lend)) else {
            return (make_caches(), 0, Vec::new());
        };
        let drop = (self.entries[i].tokens.len() - shared) as i32;
        let (mut caches, snapshots) = if copies {
            // Used now: the entry moves to the most recent end, and lends a copy.
            let entry = self.entries.remove(i);
            let copy = (entry.caches.clone(), entry.snapshots.clone());
            self.entries.push(entry);
            copy
        } else {
            let entry = self.entries.remove(i);
            (entry.caches, entry.snapshots)
        };
        let within = |upto: usize| -> Vec<Snapshot> {
            let kept = snapshots.iter().filter(|s| s.positions <= upto);
            kept.cloned().collect()
        };
        if caches.iter_mut().all(|c| c.trim(drop)) {
            return (caches, shared, within(shared));
        }
        // A recurrent state cannot be cut back: resume from the latest snapshot in the prefix
        // (the copy's other caches are cut back from wherever the trim above left them).
        let snapshot = snapshots.iter().rev().find(|s| s.positions <= shared);
        match snapshot.filter(|s| s.restore(&mut caches)) {
            Some(s) => (caches, s.positions, within(s.positions)),
            None => (make_caches(), 0, Vec::new()),
        }
    }

    /// The entry `prompt` would reuse: how many tokens it shares, its index, and whether it
    /// would be copied (an entry it shares only a part of, any with `lend`) rather than taken
    /// over (one the prompt extends whole).
    fn reuse(
        &self,
        prompt: &[u32],
        (adapter_on, lend): (bool, bool),
    ) -> Option<(usize, usize, bool)> {
        let best = (self.entries.iter().enumerate())
            .map(|(i, e)| (e.shared(prompt, adapter_on), i))
            .max();
        let (shared, i) = best.filter(|&(shared, _)| shared > 0)?;
        Some((shared, i, lend || shared < self.entries[i].tokens.len()))
    }

    /// What [`Self::take`] would do to memory for `prompt`: the bytes of the entry it would
    /// copy (one it shares only a part of, or any with `lend`: MLX copies an array written
    /// while another holds it, storage whole), and those of the entry it would take over (one
    /// the prompt extends whole: already held, they grow in place of a fresh cache).
    pub fn reuse_bytes(&self, prompt: &[u32], reuse: (bool, bool)) -> (u64, u64) {
        match self.reuse(prompt, reuse) {
            Some((_, i, true)) => (self.entries[i].bytes(), 0),
            Some((_, i, false)) => (0, self.entries[i].bytes()),
            None => (0, 0),
        }
    }

    /// Bytes of every entry.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(Kept::bytes).sum()
    }

    /// Keeps `caches` after a generation fed them `prompt`, then `sampled` tokens in order.
    /// They may hold fewer positions than that (cancelled mid-prefill) or a few more (a step
    /// queued ahead for a token never read); either way only what is known is kept. Entries
    /// whose tokens start the new one's are dropped (it serves their prompts too), then the
    /// least recently used go until the rest fit the budget.
    pub fn keep(
        &mut self,
        (mut caches, mut snapshots): (Vec<KvCache>, Vec<Snapshot>),
        prompt: &[u32],
        sampled: &[u32],
        adapter_on: bool,
    ) {
        let held = caches.first().map_or(0, |c| c.offset().max(0) as usize);
        let tokens: Vec<u32> = prompt.iter().chain(sampled).take(held).copied().collect();
        let extra = (held - tokens.len()) as i32;
        if tokens.is_empty() || !caches.iter_mut().all(|c| c.trim(extra)) {
            return;
        }
        self.entries
            .retain(|e| e.adapter_on != adapter_on || !tokens.starts_with(&e.tokens));
        snapshots.retain(|s| s.positions > 0 && s.positions < tokens.len());
        self.entries.push(Kept {
            caches,
            tokens,
            snapshots,
            adapter_on,
        });
        let mut total: u64 = self.entries.iter().map(Kept::bytes).sum();
        while total > self.budget && self.entries.len() > 1 {
            total -= self.entries.remove(0).bytes();
        }
    }

    /// Drops the least recently used entry, the one `prompt` would reuse last; `false` when
    /// none is left.
    pub fn drop_oldest(&mut self, prompt: &[u32], adapter_on: bool) -> bool {
        let best = self.reuse(prompt, (adapter_on, false)).map(|(_, i, _)| i);
        let oldest = (0..self.entries.len()).find(|&i| Some(i) != best).or(best);
        oldest.map(|i| self.entries.remove(i)).is_some()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;

    use super::*;
    use crate::layers::kv_cache::StateCache;
    use fixtures::mlx_test_lock;

    /// Two plain caches (or sliding-window ones) holding `n` positions.
    fn caches(n: i32, window: Option<i32>) -> Vec<KvCache> {
        (0..2)
            .map(|_| {
                let mut c = KvCache::for_window(window);
                if n > 0 {
                    let x = Array::from_slice(&vec![0f32; n as usize], &[1, 1, n, 1]);
                    c.update_and_fetch(x.clone(), x).unwrap();
                }
                c
            })
            .collect()
    }

    fn offsets(caches: &[KvCache]) -> Vec<i32> {
        caches.iter().map(KvCache::offset).collect()
    }

    #[test]
    fn a_longer_prompt_reuses_everything_kept() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // Prompt 1..=4 then sampled 5, 6 fed back: 6 positions.
        cache.keep((caches(6, None), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
    }

    #[test]
    fn the_same_prompt_leaves_its_last_token_to_run() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(5, None), Vec::new()), &[1, 2, 3, 4, 5], &[], true);
        let (c, reused, _) = cache.take(&[1, 2, 3, 4, 5], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
    }

    #[test]
    fn a_diverging_prompt_is_cut_back_to_the_shared_prefix() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(6, None), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused, _) = cache.take(&[1, 2, 9, 9, 9], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (2, vec![2, 2]));
        // A copy was cut back: the entry still holds all six for its own conversation.
        let (c, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // Taken whole: nothing is left to share.
        let (c, reused, _) = cache.take(&[1, 2, 9], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }

    #[test]
    fn writing_to_a_lent_copy_leaves_the_entry_as_it_was() {
        let _lock = mlx_test_lock();
        let ones = |n: i32| Array::from_slice(&vec![1f32; n as usize], &[1, 1, n, 1]);
        let mut c = KvCache::default();
        c.update_and_fetch(ones(4), ones(4)).unwrap();
        let mut cache = PromptCache::default();
        cache.keep((vec![c], Vec::new()), &[1, 2, 3, 4], &[], true);
        let (mut copy, reused, _) = cache.take(&[1, 2, 9, 9], (true, false), Vec::new);
        assert_eq!(reused, 2);
        let nines = Array::from_slice(&[9f32; 2], &[1, 1, 2, 1]);
        copy[0].update_and_fetch(nines.clone(), nines).unwrap();
        let (mut kept, reused, _) = cache.take(&[1, 2, 3, 4, 5], (true, false), Vec::new);
        assert_eq!(reused, 4);
        let (keys, _) = kept[0].update_and_fetch(ones(1), ones(1)).unwrap();
        assert_eq!(keys.as_slice::<f32>(), &[1f32; 5]);
    }

    #[test]
    fn two_conversations_taking_turns_both_hit() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(4, None), Vec::new()), &[1, 2, 3], &[4], true);
        cache.keep((caches(4, None), Vec::new()), &[7, 8, 9], &[10], true);
        let (c, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
        cache.keep(
            (caches(6, None), Vec::new()),
            &[1, 2, 3, 4, 5, 6],
            &[],
            true,
        );
        let (_, reused, _) = cache.take(&[7, 8, 9, 10, 11], (true, false), || caches(0, None));
        assert_eq!(reused, 4);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || caches(0, None));
        assert_eq!(reused, 6);
    }

    #[test]
    fn the_longest_shared_prefix_wins_and_a_prefix_entry_is_replaced() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(3, None), Vec::new()), &[1, 2, 3], &[], true);
        cache.keep((caches(3, None), Vec::new()), &[1, 5, 6], &[], true);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4], (true, false), || caches(0, None));
        assert_eq!(reused, 3);
        // [1, 2] starts [1, 2, 3, 4, 5]: the longer entry replaces it.
        cache.keep((caches(2, None), Vec::new()), &[1, 2], &[], true);
        cache.keep((caches(5, None), Vec::new()), &[1, 2, 3, 4, 5], &[], true);
        assert_eq!(cache.entries.len(), 2);
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_budget() {
        let _lock = mlx_test_lock();
        // One entry of caches(4): two layers of keys and values, 256 float32 positions each.
        let entry = 2 * 2 * 256 * 4;
        let mut cache = PromptCache::new(2 * entry);
        cache.keep((caches(4, None), Vec::new()), &[1, 1, 1, 1], &[], true);
        cache.keep((caches(4, None), Vec::new()), &[2, 2, 2, 2], &[], true);
        // Used: now the most recent.
        let (c, _, _) = cache.take(&[1, 1, 1, 9], (true, false), || caches(0, None));
        drop(c);
        cache.keep((caches(4, None), Vec::new()), &[3, 3, 3, 3], &[], true);
        let (_, reused, _) = cache.take(&[2, 2, 2, 2, 2], (true, false), || caches(0, None));
        assert_eq!(reused, 0, "the least recently used entry is gone");
        let (_, reused, _) = cache.take(&[1, 1, 1, 1, 1], (true, false), || caches(0, None));
        assert_eq!(reused, 4);
        // The newest stays even alone past the budget.
        let mut cache = PromptCache::new(1);
        cache.keep((caches(4, None), Vec::new()), &[1, 1, 1, 1], &[], true);
        let (_, reused, _) = cache.take(&[1, 1, 1, 1, 1], (true, false), || caches(0, None));
        assert_eq!(reused, 4);
    }

    #[test]
    fn positions_fed_but_never_read_are_cut_off() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // A step queued ahead fed a 7th token whose id was never read.
        cache.keep((caches(7, None), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (true, false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // A prefill cancelled after 3 of 5 prompt tokens.
        cache.keep((caches(3, None), Vec::new()), &[1, 2, 3, 4, 5], &[], true);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5], (true, false), || caches(0, None));
        assert_eq!(reused, 3);
    }

    #[test]
    fn another_adapter_position_or_nothing_shared_starts_fresh() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(4, None), Vec::new()), &[1, 2, 3, 4], &[], true);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5], (false, false), || caches(0, None));
        assert_eq!(reused, 0);
        cache.keep((caches(4, None), Vec::new()), &[1, 2, 3, 4], &[], true);
        let (_, reused, _) = cache.take(&[7, 2, 3, 4, 5], (true, false), || caches(0, None));
        assert_eq!(reused, 0);
    }

    /// A hybrid model's caches: a linear-attention layer's state and a KV cache, `n` positions.
    fn hybrid(n: i32) -> Vec<KvCache> {
        let mut state = StateCache::default();
        state.advance(n);
        let mut c = caches(n, None);
        c[0] = KvCache::State(state);
        c
    }

    #[test]
    fn a_recurrent_state_is_reused_only_by_a_prompt_that_extends_it() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((hybrid(6), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // The same tokens again: the last one would have to be forgotten, so nothing is reused.
        cache.keep((hybrid(6), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6], (true, false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
        // A diverging prompt: no shared prefix can be cut back to.
        cache.keep((hybrid(6), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (_, reused, _) = cache.take(&[1, 2, 3, 9, 9, 9, 9], (true, false), || hybrid(0));
        assert_eq!(reused, 0);
        // A step fed a token never read: the state holds it, so it is not kept at all.
        let mut cache = PromptCache::default();
        cache.keep((hybrid(7), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (true, false), || hybrid(0));
        assert_eq!(reused, 0);
    }

    #[test]
    fn a_recurrent_state_resumes_from_its_latest_snapshot_within_the_shared_prefix() {
        let _lock = mlx_test_lock();
        let snapshot = |n| Snapshot::of(&hybrid(n), n as usize).unwrap().unwrap();
        let keep = |cache: &mut PromptCache| {
            let kept = (hybrid(6), vec![snapshot(2), snapshot(4)]);
            cache.keep(kept, &[1, 2, 3, 4], &[5, 6], true);
        };
        let mut cache = PromptCache::default();
        keep(&mut cache);
        // Shares 5 tokens: resumes at 4, the states as they were there, the others cut back.
        let (c, reused, within) = cache.take(&[1, 2, 3, 4, 5, 9], (true, false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
        assert_eq!(
            within.iter().map(|s| s.positions).collect::<Vec<_>>(),
            [2, 4]
        );
        // The entry is still whole for its own conversation, and shares 3 with this one.
        let (c, reused, within) = cache.take(&[1, 2, 3, 9], (true, false), || hybrid(0));
        assert_eq!((reused, offsets(&c), within.len()), (2, vec![2, 2], 1));
        // Nothing before the first snapshot: from scratch.
        let (_, reused, _) = cache.take(&[1, 9], (true, false), || hybrid(0));
        assert_eq!(reused, 0);
        // Extending it: all of it, and its snapshots go on with the caches.
        let (c, reused, within) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || hybrid(0));
        assert_eq!((reused, offsets(&c), within.len()), (6, vec![6, 6], 2));
    }

    #[test]
    fn a_request_that_is_not_kept_borrows_an_entry_it_extends_and_leaves_it() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(6, None), Vec::new()), &[1, 2, 3, 4], &[5, 6], true);
        for _ in 0..2 {
            let (c, reused, _) =
                cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, true), || caches(0, None));
            assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        }
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || caches(0, None));
        assert_eq!(reused, 6);
        let (_, reused, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (true, false), || caches(0, None));
        assert_eq!(reused, 0, "taken whole by a request that is kept");
    }

    #[test]
    fn a_wrapped_sliding_window_cannot_be_cut_back() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // Within its window of 8: trimmable.
        cache.keep(
            (caches(6, Some(8)), Vec::new()),
            &[1, 2, 3, 4, 5, 6],
            &[],
            true,
        );
        let (c, reused, _) = cache.take(&[1, 2, 3, 9], (true, false), || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (3, vec![3, 3]));
        // Past it: positions were overwritten, so only an exact continuation could reuse it.
        let prompt: Vec<u32> = (1..=10).collect();
        cache.keep((caches(10, Some(8)), Vec::new()), &prompt, &[], true);
        let (c, reused, _) = cache.take(&[1, 2, 3, 9], (true, false), || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }
}
