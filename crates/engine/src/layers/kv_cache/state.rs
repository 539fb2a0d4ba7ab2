//! The cache of a recurrent layer (gated delta-net, short convolution, Mamba2): no keys and
//! values, but the last `kernel - 1` inputs of its causal convolution and its recurrent state,
//! as mlx-lm's
//! `ArraysCache(size=2)` holds them. Both summarise every position seen so far, so the cache
//! cannot forget positions: it can only be kept whole or dropped (`docs/decisions/hybrid.md`).

use mlx_rs::{
    ops::{self, indexing::IndexOp},
    Array,
};

use crate::layers::array::Result;

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

    /// The causal depthwise convolution of `input` `(B, S, channels)` by `weight` `(channels,
    /// kernel, 1)` (plus `bias`), over the last `kernel - 1` inputs of earlier calls (zeros at
    /// first), which it then keeps in place of them: the convolution every recurrent layer runs
    /// (mlx-lm pads and concatenates the same way). Does not advance the offset.
    pub fn convolve(
        &mut self,
        input: &Array,
        weight: &Array,
        bias: Option<&Array>,
    ) -> Result<Array> {
        let (channels, window) = (weight.dim(0), weight.dim(1) - 1);
        let state = match self.conv.take() {
            Some(state) => state,
            None => ops::zeros_dtype(&[input.dim(0), window, channels], input.dtype())?,
        };
        let padded = ops::concatenate(&[state, input.clone()], 1)?;
        let total = padded.dim(1);
        self.conv = Some(padded.index((.., total - window.., ..)));
        let out = ops::conv1d(&padded, weight, 1, 0, 1, channels)?;
        match bias {
            Some(bias) => out.add(bias),
            None => Ok(out),
        }
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
