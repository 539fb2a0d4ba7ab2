//! The attention mask a cache implies: none, causal, or explicit.

use mlx_rs::{fast::ScaledDotProductAttentionMask, Array};

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
        .flat_map(|i| (0..keys).map(move |j| j <= i && window.is_none_or(|w| i < j + w)))
        .collect();
    Array::from_slice(&allowed, &[n, keys])
}
