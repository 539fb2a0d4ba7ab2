//! The cache of a recurrent layer (gated delta-net, short convolution, Mamba2): no keys and
//! values, but the last `kernel - 1` inputs of its causal convolution and its recurrent state,
//! as mlx-lm's
//! `ArraysCache(size=2)` holds them. Both summarise every position seen so far, so the cache
//! cannot forget positions: it can only be kept whole or dropped (`docs/decisions/hybrid.md`),
//! except those of a pass it recorded ([`StateCache::record_steps`]): a speculative verification
//! keeps the state after each of its positions, so the rejected ones can be taken back.

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
    /// What taking back positions of the recorded pass needs, while one is recorded.
    steps: Option<Steps>,
}

/// A recorded pass: the state before it, the state after each of its positions, and the
/// convolution's input over the window before it and its positions.
#[derive(Clone, Default)]
struct Steps {
    before: Option<Array>,
    states: Vec<Array>,
    conv_input: Option<Array>,
    positions: i32,
}

impl StateCache {
    /// Positions seen so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// A state after `offset` positions (not recording), as stored.
    pub(super) fn holding(conv: Option<Array>, state: Option<Array>, offset: i32) -> Self {
        Self {
            conv,
            state,
            offset,
            steps: None,
        }
    }

    /// Records that `n` more positions went into the state (mlx-lm's `advance`).
    pub fn advance(&mut self, n: i32) {
        self.offset += n;
        if let Some(steps) = &mut self.steps {
            steps.positions += n;
        }
    }

    /// Ends a recording, if one runs.
    pub(super) fn stop_recording(&mut self) {
        self.steps = None;
    }

    /// Records the next pass, so that [`Self::trim`] can take back any of its positions (until
    /// the next trim, which ends the recording).
    pub fn record_steps(&mut self) {
        self.steps = Some(Steps {
            before: self.state.clone(),
            ..Steps::default()
        });
    }

    /// Where a layer with a recurrent state puts the state after each position of a recorded
    /// pass; `None` when no pass is recorded.
    pub fn step_states(&mut self) -> Option<&mut Vec<Array>> {
        self.steps.as_mut().map(|s| &mut s.states)
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
        if let Some(steps) = &mut self.steps {
            steps.conv_input = Some(padded.clone());
        }
        let out = ops::conv1d(&padded, weight, 1, 0, 1, channels)?;
        match bias {
            Some(bias) => out.add(bias),
            None => Ok(out),
        }
    }

    /// Forgets the last `n` positions: possible for none of them, or for positions of the pass
    /// recorded last (then the window and the state are those after the positions kept). Ends
    /// the recording.
    pub fn trim(&mut self, n: i32) -> bool {
        let steps = self.steps.take();
        if n <= 0 {
            return true;
        }
        let Some(steps) = steps.filter(|s| n <= s.positions) else {
            return false;
        };
        let keep = steps.positions - n;
        if self.state.is_some() && steps.states.len() != steps.positions as usize {
            return false;
        }
        if let (Some(conv), Some(input)) = (&self.conv, &steps.conv_input) {
            let window = conv.dim(1);
            self.conv = Some(input.index((.., keep..keep + window, ..)));
        }
        self.state = match keep {
            0 => steps.before,
            k => steps.states.into_iter().nth(k as usize - 1),
        };
        self.offset -= n;
        true
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.conv.iter().chain(self.state.iter())
    }
}
