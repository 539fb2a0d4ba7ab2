//! DSpark's Markov head beside the DFlash block drafter (mlx-vlm's `dspark` drafter): each
//! guess's logits are the block's plus a low-rank transition from the guess before it
//! (`VanillaMarkov`), so the guesses are drawn one after another.

use mlx_rs::Array;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::{Embedding, Linear, Result},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// `logits + w2(w1[previous])`.
pub struct MarkovHead {
    w1: Embedding,
    w2: Linear,
}

impl MarkovHead {
    pub fn load(weights: &mut Weights) -> LoadResult<Self> {
        // The confidence head only steers mlx-vlm's block size, never a guess.
        weights.drop_prefixed("confidence_head.");
        Ok(Self {
            w1: weights.embedding("markov_head.markov_w1")?,
            w2: weights.linear("markov_head.markov_w2")?,
        })
    }

    /// One position's logits `(1, V)` after the guess `previous` `(1,)`.
    pub fn step(&self, logits: &Array, previous: &Array) -> Result<Array> {
        logits.add(self.w2.forward(&self.w1.forward(previous)?)?)
    }
}
