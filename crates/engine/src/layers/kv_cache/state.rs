//! The cache of a linear-attention layer (gated delta-net): no keys and values, but the last
//! `kernel - 1` inputs of its causal convolution and its recurrent state, as mlx-lm's
//! `ArraysCache(size=2)` holds them. Both summarise every position seen so far, so the cache
//! cannot forget positions: it can only be kept whole or dropped (`docs/decisions/hybrid.md`).

use mlx_rs::Array;

/// Convolution inputs `(B, kernel - 1, channels)` and recurrent state `(B, Hv, Dv, Dk)`.
#[derive(Clone, Default)]
pub struct StateCache {
    pub conv: Option<Array>,
    pub state: Option<Array>,
    offset: i32,
}

impl StateCache {
    /// Positions seen so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Records that `n` more positions went into the state (mlx-lm's `advance`).
    pub fn advance(&mut self, n: i32) {
        self.offset += n;
    }

    /// Forgetting positions is possible only for none of them.
    pub fn trim(&mut self, n: i32) -> bool {
        n <= 0
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.state.iter())
    }
}
