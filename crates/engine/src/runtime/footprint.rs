//! What a resident model costs in memory, priced as it loads: its weights (from the
//! checkpoint's headers, before MLX reads them), its KV cache at any number of tokens (each
//! layer's cache priced from a one-token pass at the KV width generations use), and the
//! activations of a prefill chunk. `load` fits the context to the memory left with it;
//! `generate` admits a request only where its cache and activations fit what MLX has left, and
//! answers a typed error where they do not, instead of letting MLX run out
//! (docs/decisions/memory-budget.md).

use mlx_rs::{transforms::eval, Array, Dtype};
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::device::Backend,
    layers::kv_cache::{CacheSize, Caches, KvCache},
    models::{self, Input, LanguageModel},
    runtime::memory,
    runtime::prompt_cache::{Owner, PromptCache},
    runtime::request::MemoryPlan,
};

/// Bytes of activations per prompt token of a prefill chunk, per byte of the hidden state and
/// the MLP's width together: Studio 2026.10's measured factor for MLX (`_ATTENTION_LIVE`).
const LIVE_ACTIVATIONS: f64 = 3.5;

/// The least context `load` fits a model to unless the model's own is smaller; under it, the
/// context stays where it was and `generate` refuses what does not fit when it comes.
const FIT_FLOOR: u64 = 4096;

/// Fitted contexts are whole steps of the caches' storage.
const FIT_STEP: u64 = 256;

/// A resident model's memory, as a function of the tokens a generation holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Footprint {
    /// The model's weights as held (its vision tower's and its drafter's with them).
    pub weights: u64,
    /// Each layer's cache, the drafter's after the model's; empty where not priced.
    layers: Vec<CacheSize>,
    /// Activation bytes per token of a prefill chunk.
    per_chunk_token: u64,
    /// Bytes per (query, key) pair of an attention score matrix, all heads: 0 where attention
    /// is fused (Metal's kernels never hold the matrix).
    per_score: u64,
    /// Prompt tokens per prefill pass.
    chunk: u64,
    /// One row of logits.
    logits: u64,
}

/// What [`price`] reads of the model and the device.
pub(crate) struct Pricing<'a> {
    pub config: &'a Value,
    pub weights: u64,
    pub kv_bits: Option<u8>,
    pub chunk: usize,
    pub backend: Backend,
    /// The weights' float dtype.
    pub dtype: Dtype,
    /// The engine runs in a group of ranks.
    pub in_group: bool,
}

/// Prices `model` (and the draft model beside it): a one-token pass through fresh caches at
/// the KV width, each cache's size read off what it then holds. Not priced (weights only) in a
/// group of ranks: each rank would judge by its own memory, and ranks that decided a context
/// or an admission differently would fall out of step.
pub(crate) fn price(
    model: &dyn LanguageModel,
    draft: Option<&dyn LanguageModel>,
    on: Pricing,
) -> Result<Footprint, EngineError> {
    let text = |key: &str| models::text_number(on.config, key);
    let hidden = model.facts().hidden_size as u64;
    let mlp = text("intermediate_size")
        .or_else(|| text("moe_intermediate_size"))
        .unwrap_or(4 * hidden);
    let heads = text("num_attention_heads").unwrap_or(1);
    let float_bytes = if on.dtype == Dtype::Float32 { 4 } else { 2 };
    let mut footprint = Footprint {
        weights: on.weights,
        layers: Vec::new(),
        per_chunk_token: ((hidden + mlp) as f64 * float_bytes as f64 * LIVE_ACTIVATIONS) as u64,
        per_score: match on.backend {
            Backend::Metal => 0,
            // The scores and their softmax, float32.
            _ => heads * 4 * 2,
        },
        chunk: on.chunk as u64,
        logits: model.facts().embedding_rows as u64 * 4,
    };
    if on.in_group {
        return Ok(footprint);
    }
    footprint.layers = probe(model, on.kv_bits)?;
    if let Some(draft) = draft {
        footprint.layers.extend(probe(draft, None)?);
    }
    Ok(footprint)
}

/// Each layer's cache size, from caches holding one position at the KV width. The pass reads
/// every weight of the language model, the embedding table and the output layer included, so
/// that none is left to be read from the files at a generation's first use (docs/traps.md,
/// "Some weights are read at their first use").
fn probe(model: &dyn LanguageModel, kv_bits: Option<u8>) -> Result<Vec<CacheSize>, EngineError> {
    let mut caches = model.make_caches();
    let token = Array::from_slice(&[0i32], &[1, 1]);
    let logits = model.forward(Input::tokens(&token), Caches::One(&mut caches))?;
    if let Some(bits) = kv_bits {
        for cache in caches.iter_mut() {
            cache.quantize(i32::from(bits))?;
        }
    }
    eval(caches.iter().flat_map(KvCache::arrays).chain([&logits]))?;
    Ok(caches.iter().map(KvCache::size).collect())
}

impl Footprint {
    /// Bytes of the KV cache (every layer's, the drafter's) holding `tokens`, at its most:
    /// right after a prefill chunk.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        let pass = self.chunk.min(tokens.max(1));
        self.layers.iter().map(|l| l.bytes_at(tokens, pass)).sum()
    }

    /// Bytes of the activations of a prefill chunk attending to `tokens`.
    pub fn compute_bytes(&self, tokens: u64) -> u64 {
        let chunk = self.chunk.min(tokens.max(1));
        chunk * (self.per_chunk_token + tokens * self.per_score) + self.logits
    }

    /// What a generation holding `tokens` needs beside the weights.
    pub fn bytes(&self, tokens: u64) -> u64 {
        self.kv_bytes(tokens) + self.compute_bytes(tokens)
    }

    /// The most tokens, at most `ceiling`, whose [`Footprint::bytes`] fit `available`.
    pub fn tokens_within(&self, available: u64, ceiling: u64) -> u64 {
        let (mut lo, mut hi) = (0, ceiling);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            match self.bytes(mid) <= available {
                true => lo = mid,
                false => hi = mid - 1,
            }
        }
        lo
    }

    /// The context `load` serves, and the plan that says why: `asked` (the `max_seq_length`
    /// pinned, else the model's own context) where a generation of that length fits
    /// `available` (the budget less the weights); else, unless pinned, the most whole steps of
    /// 256 tokens that fit, never below 4096 (or the model's own, if smaller).
    pub fn fit(&self, asked: u64, pinned: bool, available: Option<u64>) -> (u64, MemoryPlan) {
        let mut plan = MemoryPlan {
            weights_bytes: self.weights,
            kv_bytes: self.kv_bytes(asked),
            compute_bytes: self.compute_bytes(asked),
            available_bytes: available,
            fitted_from: None,
            reason: None,
        };
        let Some(available) = available.filter(|_| !self.layers.is_empty()) else {
            return (asked, plan);
        };
        let needed = self.bytes(asked);
        if needed <= available {
            return (asked, plan);
        }
        let gb = |b: u64| b as f64 / 1e9;
        let fits = self.tokens_within(available, asked) / FIT_STEP * FIT_STEP;
        let floor = FIT_FLOOR.min(asked);
        let mut context = asked;
        plan.reason = Some(if pinned {
            format!(
                "a {asked}-token context needs {:.2} GB of KV cache and activations beside the \
                 weights, and {:.2} GB is left for them: a request that does not fit when it \
                 comes is refused (about {fits} tokens fit)",
                gb(needed),
                gb(available)
            )
        } else if fits < floor {
            format!(
                "even a {floor}-token context needs more than the {:.2} GB left beside the \
                 weights: a request that does not fit when it comes is refused (about {fits} \
                 tokens fit)",
                gb(available)
            )
        } else {
            plan.fitted_from = Some(asked);
            context = fits;
            plan.kv_bytes = self.kv_bytes(fits);
            plan.compute_bytes = self.compute_bytes(fits);
            format!(
                "fitted to memory: a {asked}-token context needs {:.2} GB of KV cache and \
                 activations beside the weights; {:.2} GB is left, which holds {fits} tokens",
                gb(needed),
                gb(available)
            )
        });
        (context, plan)
    }
}

/// Admits a generation of `prompt` (its cache keys) and up to `max_new` more tokens where its
/// cache and activations fit what MLX has left under its limit, less what the generations
/// beside it will still grow by (`others`: the positions each holds now and at most by its end),
/// counting a kept cache it would copy and not one it would take over: first the least recently
/// used of `cache`'s conversations go (the one it would reuse last), then `max_new` is cut to
/// what fits (the answer ends as at `max_new_tokens`); a prompt that does not fit even with
/// every kept conversation gone is refused at once with what it needs, the cache left as it is.
pub(crate) fn admit(
    footprint: &Footprint,
    (prompt, owner, lend): (&[u32], &Owner, bool),
    max_new: &mut usize,
    cache: &mut PromptCache,
    others: impl Iterator<Item = (usize, usize)>,
) -> Result<(), EngineError> {
    let Some(limit) = memory::limit_bytes().filter(|_| !footprint.layers.is_empty()) else {
        return Ok(());
    };
    let (n, wanted) = (prompt.len() as u64, (prompt.len() + *max_new) as u64);
    let growth = |(now, end): (usize, usize)| {
        let kv = |t: usize| footprint.kv_bytes(t as u64);
        kv(end).saturating_sub(kv(now))
    };
    let reserved: u64 = others.map(growth).sum();
    let left = || {
        let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
        limit.saturating_sub(active + reserved)
    };
    let refused = |available: u64, fits: u64| EngineError::MemoryBudget {
        prompt_tokens: prompt.len(),
        tokens_that_fit: fits as usize,
        needed_bytes: footprint.bytes(n + 1),
        available_bytes: available,
    };
    // Even with every kept conversation gone.
    let at_most = left() + cache.bytes();
    if footprint.bytes(n + 1) > at_most {
        return Err(refused(left(), footprint.tokens_within(at_most, wanted)));
    }
    loop {
        let available = left();
        let (copied, taken_over) = cache.reuse_bytes(prompt, (owner, lend));
        let room = (available + taken_over).saturating_sub(copied);
        let fits = footprint.tokens_within(room, wanted);
        if fits >= wanted {
            return Ok(());
        }
        if cache.drop_oldest(prompt, owner) {
            let _ = mlx_rs::memory::clear_cache();
            continue;
        }
        if fits > n {
            tracing::warn!(
                prompt = n,
                wanted,
                fits,
                "max_new_tokens cut to what fits in memory"
            );
            *max_new = (fits - n) as usize;
            return Ok(());
        }
        return Err(refused(available, fits));
    }
}

/// Bytes MLX may still allocate under its limit (all, without one).
pub(crate) fn free_bytes() -> u64 {
    let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
    memory::limit_bytes().map_or(u64::MAX, |limit| limit.saturating_sub(active))
}

/// Whether a generation of `prompt` tokens and `max_new` more should wait for the generations
/// beside it (`others`, as [`admit`] takes them) rather than be cut or refused: it does not fit
/// whole beside them, but would once they end (their caches then are kept conversations, which
/// a generation that needs the memory has dropped, or freed).
pub(crate) fn waits(
    footprint: &Footprint,
    (prompt, max_new): (usize, usize),
    cache: &PromptCache,
    others: impl Iterator<Item = (usize, usize)>,
) -> bool {
    let Some(limit) = memory::limit_bytes().filter(|_| !footprint.layers.is_empty()) else {
        return false;
    };
    let others: Vec<(usize, usize)> = others.collect();
    if others.is_empty() {
        return false;
    }
    let kv = |t: usize| footprint.kv_bytes(t as u64);
    let reserved: u64 = others
        .iter()
        .map(|&(now, end)| kv(end).saturating_sub(kv(now)))
        .sum();
    let held: u64 = others.iter().map(|&(now, _)| kv(now)).sum();
    let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
    let free = limit.saturating_sub(active) + cache.bytes();
    let needed = footprint.bytes((prompt + max_new) as u64);
    needed > free.saturating_sub(reserved) && needed <= free + held
}

#[cfg(test)]
mod tests {
    use super::{admit, waits, Footprint};
    use crate::{
        error::EngineError,
        layers::kv_cache::CacheSize,
        runtime::prompt_cache::{Owner, PromptCache},
    };

    /// 1000 bytes a position, nothing else: 256,000 bytes per step of 256 positions.
    fn thousand_a_position() -> Footprint {
        Footprint {
            layers: vec![CacheSize {
                per_position: 1000,
                ..CacheSize::default()
            }],
            chunk: 512,
            ..Footprint::default()
        }
    }

    /// `admit` with 600,000 bytes left under the limit (two steps of positions fit, not three).
    fn admit_with_room(
        prompt: usize,
        max_new: &mut usize,
        running: &[(usize, usize)],
    ) -> Result<(), EngineError> {
        let _mlx = fixtures::mlx_test_lock();
        let active = mlx_rs::memory::active_memory().unwrap();
        let limit = mlx_rs::memory::set_memory_limit(active + 600_000).unwrap();
        let ids: Vec<u32> = (0..prompt as u32).collect();
        let mut cache = PromptCache::new(0);
        let footprint = thousand_a_position();
        let admitted = admit(
            &footprint,
            (&ids, &Owner::default(), false),
            max_new,
            &mut cache,
            running.iter().copied(),
        );
        mlx_rs::memory::set_memory_limit(limit).unwrap();
        admitted
    }

    #[test]
    fn what_does_not_fit_is_cut_then_refused() {
        let mut max_new = 100;
        admit_with_room(300, &mut max_new, &[]).unwrap();
        assert_eq!(max_new, 100, "fits whole");
        let mut max_new = 1000;
        admit_with_room(300, &mut max_new, &[]).unwrap();
        assert_eq!(max_new, 212, "cut to the 512 positions that fit");
        match admit_with_room(600, &mut 10, &[]) {
            Err(EngineError::MemoryBudget {
                prompt_tokens,
                tokens_that_fit,
                needed_bytes,
                available_bytes,
            }) => {
                assert_eq!((prompt_tokens, tokens_that_fit), (600, 512));
                assert_eq!((needed_bytes, available_bytes), (768_000, 600_000));
            }
            other => panic!("expected a memory budget error, got {other:?}"),
        }
    }

    #[test]
    fn running_rows_keep_room_to_grow() {
        // A row at 10 positions that may reach 300 will take a second step of 256 positions.
        let mut max_new = 10;
        match admit_with_room(300, &mut max_new, &[(10, 300)]) {
            Err(EngineError::MemoryBudget {
                tokens_that_fit, ..
            }) => {
                assert_eq!(tokens_that_fit, 256)
            }
            other => panic!("expected a memory budget error, got {other:?}"),
        }
        // One that ends within its current step takes nothing more.
        admit_with_room(300, &mut max_new, &[(10, 200)]).unwrap();
    }

    #[test]
    fn what_fits_alone_waits_for_the_rows_beside_it() {
        let _mlx = fixtures::mlx_test_lock();
        let active = mlx_rs::memory::active_memory().unwrap();
        let limit = mlx_rs::memory::set_memory_limit(active + 600_000).unwrap();
        let (footprint, cache) = (thousand_a_position(), PromptCache::new(0));
        let waits = |len: usize, others: &[(usize, usize)]| {
            waits(&footprint, (len, 10), &cache, others.iter().copied())
        };
        // Alone it would not wait; beside a row that will grow a step it waits; too big even
        // once that row is done (its step counts as held, freed at its end) it does not: it is
        // refused or cut instead.
        let verdicts = (
            waits(300, &[]),
            waits(300, &[(10, 300)]),
            waits(900, &[(10, 300)]),
        );
        mlx_rs::memory::set_memory_limit(limit).unwrap();
        assert_eq!(verdicts, (false, true, false));
    }
}
