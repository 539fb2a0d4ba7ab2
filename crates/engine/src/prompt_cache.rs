//! The prompt cache: a resident model keeps the KV caches of its last generation and the
//! tokens they hold, and the next generation whose prompt starts with the same tokens (a chat's
//! next turn) prefills only the rest. `usage.cached_tokens` reports the reuse.
//!
//! Reused caches are cut back to the shared prefix (at most the prompt minus its last token,
//! which must run to give the first logits). A cache that cannot be cut back (a sliding-window
//! ring that has wrapped, a linear-attention layer's recurrent state: those are reused only
//! when the new prompt extends the kept tokens) or that was made with the adapter in the other
//! position is dropped.

use crate::kv_cache::KvCache;

#[derive(Default)]
pub(crate) struct PromptCache {
    kept: Option<Kept>,
}

struct Kept {
    caches: Vec<KvCache>,
    /// The tokens the caches hold, in order.
    tokens: Vec<u32>,
    /// Whether the adapter (if any) was on when they were computed.
    adapter_on: bool,
}

impl PromptCache {
    /// Caches for generating from `prompt`: the kept ones cut back to the longest prefix they
    /// share with it, or fresh ones. Returns them and how many prompt tokens they already hold.
    pub fn take(
        &mut self,
        prompt: &[u32],
        adapter_on: bool,
        make_caches: impl FnOnce() -> Vec<KvCache>,
    ) -> (Vec<KvCache>, usize) {
        let fresh = || (make_caches(), 0);
        let Some(mut kept) = self.kept.take() else {
            return fresh();
        };
        let shared = kept
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        if shared == 0 || kept.adapter_on != adapter_on {
            return fresh();
        }
        let drop = (kept.tokens.len() - shared) as i32;
        if !kept.caches.iter_mut().all(|c| c.trim(drop)) {
            return fresh();
        }
        (kept.caches, shared)
    }

    /// Keeps `caches` after a generation fed them `prompt`, then `sampled` tokens in order.
    /// They may hold fewer positions than that (cancelled mid-prefill) or a few more (a step
    /// queued ahead for a token never read); either way only what is known is kept.
    pub fn keep(
        &mut self,
        mut caches: Vec<KvCache>,
        prompt: &[u32],
        sampled: &[u32],
        adapter_on: bool,
    ) {
        let held = caches.first().map_or(0, |c| c.offset().max(0) as usize);
        let tokens: Vec<u32> = prompt.iter().chain(sampled).take(held).copied().collect();
        let extra = (held - tokens.len()) as i32;
        if tokens.is_empty() || !caches.iter_mut().all(|c| c.trim(extra)) {
            self.kept = None;
            return;
        }
        self.kept = Some(Kept {
            caches,
            tokens,
            adapter_on,
        });
    }

    pub fn clear(&mut self) {
        self.kept = None;
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;

    use super::*;
    use crate::kv_cache::StateCache;
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
        cache.keep(caches(6, None), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], true, || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
    }

    #[test]
    fn the_same_prompt_leaves_its_last_token_to_run() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(caches(5, None), &[1, 2, 3, 4, 5], &[], true);
        let (c, reused) = cache.take(&[1, 2, 3, 4, 5], true, || caches(0, None));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
    }

    #[test]
    fn a_diverging_prompt_is_cut_back_to_the_shared_prefix() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(caches(6, None), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused) = cache.take(&[1, 2, 9, 9, 9], true, || caches(0, None));
        assert_eq!((reused, offsets(&c)), (2, vec![2, 2]));
        // Taken: a second take starts fresh.
        let (c, reused) = cache.take(&[1, 2, 9], true, || caches(0, None));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }

    #[test]
    fn positions_fed_but_never_read_are_cut_off() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // A step queued ahead fed a 7th token whose id was never read.
        cache.keep(caches(7, None), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], true, || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // A prefill cancelled after 3 of 5 prompt tokens.
        cache.keep(caches(3, None), &[1, 2, 3, 4, 5], &[], true);
        let (_, reused) = cache.take(&[1, 2, 3, 4, 5], true, || caches(0, None));
        assert_eq!(reused, 3);
    }

    #[test]
    fn another_adapter_position_or_nothing_shared_starts_fresh() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(caches(4, None), &[1, 2, 3, 4], &[], true);
        let (_, reused) = cache.take(&[1, 2, 3, 4, 5], false, || caches(0, None));
        assert_eq!(reused, 0);
        cache.keep(caches(4, None), &[1, 2, 3, 4], &[], true);
        let (_, reused) = cache.take(&[7, 2, 3, 4, 5], true, || caches(0, None));
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
        cache.keep(hybrid(6), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused) = cache.take(&[1, 2, 3, 4, 5, 6, 7], true, || hybrid(0));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // The same tokens again: the last one would have to be forgotten, so nothing is reused.
        cache.keep(hybrid(6), &[1, 2, 3, 4], &[5, 6], true);
        let (c, reused) = cache.take(&[1, 2, 3, 4, 5, 6], true, || hybrid(0));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
        // A diverging prompt: no shared prefix can be cut back to.
        cache.keep(hybrid(6), &[1, 2, 3, 4], &[5, 6], true);
        let (_, reused) = cache.take(&[1, 2, 3, 9, 9, 9, 9], true, || hybrid(0));
        assert_eq!(reused, 0);
        // A step fed a token never read: the state holds it, so it is not kept at all.
        cache.keep(hybrid(7), &[1, 2, 3, 4], &[5, 6], true);
        let (_, reused) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], true, || hybrid(0));
        assert_eq!(reused, 0);
    }

    #[test]
    fn a_wrapped_sliding_window_cannot_be_cut_back() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // Within its window of 8: trimmable.
        cache.keep(caches(6, Some(8)), &[1, 2, 3, 4, 5, 6], &[], true);
        let (c, reused) = cache.take(&[1, 2, 3, 9], true, || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (3, vec![3, 3]));
        // Past it: positions were overwritten, so only an exact continuation could reuse it.
        let prompt: Vec<u32> = (1..=10).collect();
        cache.keep(caches(10, Some(8)), &prompt, &[], true);
        let (c, reused) = cache.take(&[1, 2, 3, 9], true, || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }
}
