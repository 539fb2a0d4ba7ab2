//! A family's own computations around the shared layers ([`Family`] hooks), Llama's by default.

use mlx_rs::Array;

use crate::{
    error::EngineError,
    layers::{weights::Weights, Linear, Result},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// What a family computes its own way around the shared layers, where mlx-lm's model file for
/// it differs from Llama's. Every hook defaults to what Llama does; a family overrides the ones
/// it needs in its own file.
pub trait Family {
    /// The RMS-norm scale to apply, from the weight as stored (at load, once per norm).
    fn norm_weight(&self, stored: Array) -> Result<Array> {
        Ok(stored)
    }

    /// The token embeddings as the first block takes them.
    fn scale_embeddings(&self, h: Array) -> Result<Array> {
        Ok(h)
    }

    /// Whether the blocks' and the final norms are layer norms (with an offset where the
    /// checkpoint has one), not RMS norms (Cohere).
    fn layer_norms(&self) -> bool {
        false
    }

    /// A residual connection: `x + y`.
    fn residual(&self, x: &Array, y: &Array) -> Result<Array> {
        x.add(y)
    }

    /// The logits as the head gives them.
    fn logits(&self, logits: Array) -> Result<Array> {
        Ok(logits)
    }

    /// Each layer's extra input `(B, L, layers, width)` for the blocks' per-layer input gates
    /// (Gemma 4), from the token ids (`None`: given embeddings) and the scaled embeddings.
    fn per_layer_inputs(&self, _tokens: Option<&Array>, _h: &Array) -> Result<Option<Array>> {
        Ok(None)
    }

    /// Whether [`Family::per_layer_inputs`] gives inputs (layers then read more than the
    /// hidden state: a model split over a group cannot have them).
    fn has_per_layer_inputs(&self) -> bool {
        false
    }

    /// Takes from the checkpoint what the family keeps per layer beside the shared block, for
    /// layer `index` (tensors under `prefix`, `model.layers.N`), at load, for the layers this
    /// rank runs.
    fn load_layer(
        &mut self,
        _weights: &mut Weights,
        _index: usize,
        _prefix: &str,
    ) -> LoadResult<()> {
        Ok(())
    }

    /// Layer `index`'s output after its block, given its per-layer input
    /// ([`Family::per_layer_inputs`], indexed).
    fn finish_layer(
        &self,
        _index: usize,
        out: Array,
        _per_layer_input: Option<&Array>,
    ) -> Result<Array> {
        Ok(out)
    }

    /// The hidden state the layers carry, from the scaled embeddings (after
    /// [`Family::per_layer_inputs`] read them): Gemma 3n's AltUp streams `(n, B, L, hidden)`;
    /// every other family carries `h` itself.
    fn widen(&self, h: Array) -> Result<Array> {
        Ok(h)
    }

    /// `(B, L, hidden)` for the final norm, from what the layers carried ([`Family::widen`]).
    fn narrow(&self, h: Array) -> Result<Array> {
        Ok(h)
    }

    /// Layer `index` over the carried hidden state `h`: its block (`block`, over `(B, L,
    /// hidden)`), then [`Family::finish_layer`].
    fn layer(
        &self,
        index: usize,
        h: &Array,
        per_layer_input: Option<&Array>,
        block: &mut dyn FnMut(&Array) -> Result<Array>,
    ) -> Result<Array> {
        let out = block(h)?;
        self.finish_layer(index, out, per_layer_input)
    }

    /// The family's own linear layers under their checkpoint names.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        Vec::new()
    }
}

/// The Llama family's choices: every hook as it defaults.
pub struct Llama;

impl Family for Llama {}
