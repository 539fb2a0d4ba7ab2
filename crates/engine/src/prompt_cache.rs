//! The prompt cache: a resident model keeps the KV caches of its last generation and the
//! tokens they hold, and the next generation whose prompt starts with the same tokens (a chat's
//! next turn) prefills only the rest. `usage.cached_tokens` reports the reuse.
//!
//! Reused caches are cut back to the shared prefix (at most the prompt minus its last token,
//! which must run to give the first logits). A cache that cannot be cut back (a sliding-window
//! ring that has wrapped) or that was made with the adapter in the other position is dropped.

use crate::{kv_cache::KvCache, models::LanguageModel};

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
        model: &dyn LanguageModel,
        prompt: &[u32],
        adapter_on: bool,
    ) -> (Vec<KvCache>, usize) {
        let fresh = || (model.make_caches(), 0);
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
