//! KV caches, one per attention layer, and the attention mask each implies.
//!
//! Full-attention layers keep every position ([`StandardCache`], mlx-lm's `KVCache`);
//! sliding-window layers keep the last `window` positions in a ring ([`RotatingCache`],
//! mlx-lm's `RotatingKVCache`). Both mirror mlx-lm's update rules exactly, because the order of
//! keys in the cache and the mask shapes decide the floating-point sums, and parity is token
//! for token.

mod rotating;
mod standard;

use mlx_rs::{fast::ScaledDotProductAttentionMask, Array};

pub use rotating::RotatingCache;
pub use standard::StandardCache;

use crate::nn::Result;

/// Positions added to a cache's storage at a time.
const STEP: i32 = 256;

/// The cache of one attention layer.
pub enum KvCache {
    Standard(StandardCache),
    Rotating(RotatingCache),
}

impl Default for KvCache {
    fn default() -> Self {
        Self::Standard(StandardCache::default())
    }
}

impl KvCache {
    /// A cache for a layer that attends to the last `window` positions, or to all of them.
    pub fn for_window(window: Option<i32>) -> Self {
        match window {
            Some(w) => Self::Rotating(RotatingCache::new(w)),
            None => Self::default(),
        }
    }

    /// Positions seen so far (the RoPE offset of the next token).
    pub fn offset(&self) -> i32 {
        match self {
            Self::Standard(c) => c.offset(),
            Self::Rotating(c) => c.offset(),
        }
    }

    /// The mask for attending from `n` new positions, asked before they are added.
    pub fn mask(&self, n: i32) -> Result<Mask> {
        match self {
            Self::Standard(_) if n > 1 => Ok(Mask::Causal),
            Self::Standard(_) => Ok(Mask::None),
            Self::Rotating(c) => c.mask(n),
        }
    }

    /// Adds `(B, H, L, D)` keys and values; returns the keys and values to attend to.
    pub fn update_and_fetch(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        match self {
            Self::Standard(c) => c.update_and_fetch(k, v),
            Self::Rotating(c) => c.update_and_fetch(k, v),
        }
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            Self::Standard(c) => Box::new(c.arrays()),
            Self::Rotating(c) => Box::new(c.arrays()),
        }
    }
}

/// An attention mask: none (one query sees every cached key), causal, or explicit booleans
/// `(L, S)` (true = may attend).
pub enum Mask {
    None,
    Causal,
    Array(Array),
}

impl Mask {
    /// The form `fast::scaled_dot_product_attention` takes.
    pub fn as_sdpa(&self) -> Option<ScaledDotProductAttentionMask<'_>> {
        match self {
            Self::None => None,
            Self::Causal => Some(ScaledDotProductAttentionMask::Causal),
            Self::Array(a) => Some(ScaledDotProductAttentionMask::Array(a)),
        }
    }
}

/// mlx-lm's `create_causal_mask`: `n` queries at positions `offset..offset + n` over keys at
/// `0..offset + n`; query `i` sees key `j` when `j <= i` and, with a window, `i < j + window`.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Array {
    let keys = offset + n;
    let allowed: Vec<bool> = (offset..keys)
        .flat_map(|i| (0..keys).map(move |j| j <= i && window.map_or(true, |w| i < j + w)))
        .collect();
    Array::from_slice(&allowed, &[n, keys])
}

#[cfg(test)]
mod tests;
