//! The cache of one layer, by kind.

use mlx_rs::Array;

use super::{
    chunked::ChunkedCache, mask::Mask, quantized::QuantizedCache, rotating::RotatingCache,
    standard::StandardCache, state::StateCache,
};
use crate::layers::array::Result;

/// The cache of one attention layer (or linear-attention layer: [`KvCache::State`]).
///
/// A clone shares its arrays with the original until either is written: MLX arrays are values
/// (an update makes a new array), so writing to one never changes the other.
#[derive(Clone)]
pub enum KvCache {
    Standard(StandardCache),
    Rotating(RotatingCache),
    Quantized(QuantizedCache),
    State(StateCache),
    Chunked(ChunkedCache),
    /// Two caches a layer updates itself, in step (mlx-lm's `CacheList`): DeepSeek sparse
    /// attention's latents and its indexer's keys. The first gives the offset and the mask.
    Pair(Box<[KvCache; 2]>),
}

/// Group size of quantized KV caches (mlx-lm's `kv_group_size` default).
pub const KV_GROUP_SIZE: i32 = 64;

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

    /// A cache for a layer whose positions attend within chunks of `chunk` (Llama 4).
    pub fn for_chunk(chunk: i32) -> Self {
        Self::Chunked(ChunkedCache::new(chunk))
    }

    /// Two standard caches in step ([`KvCache::Pair`]).
    pub fn pair() -> Self {
        Self::Pair(Box::new([Self::default(), Self::default()]))
    }

    /// Positions seen so far (the RoPE offset of the next token).
    pub fn offset(&self) -> i32 {
        match self {
            Self::Pair(p) => p[0].offset(),
            Self::Standard(c) => c.offset(),
            Self::Rotating(c) => c.offset(),
            Self::Quantized(c) => c.offset(),
            Self::State(c) => c.offset(),
            Self::Chunked(c) => c.offset(),
        }
    }

    /// The mask for attending from `n` new positions, asked before they are added (mlx-lm's
    /// `make_mask`, what `create_attention_mask` asks of a cache). The decoder asks it once per
    /// forward pass, of the first cache of each kind of layer, and every layer of that kind
    /// attends with it.
    pub fn mask(&self, n: i32) -> Result<Mask> {
        match self {
            Self::Standard(_) | Self::Quantized(_) if n > 1 => Ok(Mask::Causal),
            Self::Standard(_) | Self::Quantized(_) => Ok(Mask::None),
            Self::Rotating(c) => c.mask(n),
            Self::Chunked(c) => Ok(c.mask(n)),
            Self::Pair(p) => p[0].mask(n),
            // mlx-lm's `create_ssm_mask`: none without padding.
            Self::State(_) => Ok(Mask::None),
        }
    }

    /// Adds `(B, H, L, D)` keys and values; returns the keys and values to attend to (plain
    /// caches only: a quantized one attends itself, see [`Self::update_and_attend`]).
    pub fn update_and_fetch(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        match self {
            Self::Standard(c) => c.update_and_fetch(k, v),
            Self::Rotating(c) => c.update_and_fetch(k, v),
            Self::Chunked(c) => c.update_and_fetch(k, v),
            Self::Quantized(_) => Err(mlx_rs::error::Exception::custom(
                "a quantized KV cache has no plain keys and values to fetch",
            )),
            Self::State(_) => Err(mlx_rs::error::Exception::custom(
                "a linear-attention layer's cache holds no keys and values",
            )),
            Self::Pair(_) => Err(mlx_rs::error::Exception::custom(
                "a pair of caches is updated one by one by its layer",
            )),
        }
    }

    /// Adds `(B, H, L, D)` keys and values, then attends from queries `(B, Hq, L, D)` with
    /// `mask` (asked of [`Self::mask`] before the update) and per-head attention `sinks`
    /// (`(Hq,)` logits; a quantized cache takes none, as in mlx-lm). Returns `(B, Hq, L, D)`.
    pub fn update_and_attend(
        &mut self,
        q: Array,
        k: Array,
        v: Array,
        scale: f32,
        mask: &Mask,
        sinks: Option<&Array>,
    ) -> Result<Array> {
        if let Self::Quantized(c) = self {
            if sinks.is_some() {
                return Err(mlx_rs::error::Exception::custom(
                    "a quantized KV cache cannot attend with attention sinks",
                ));
            }
            return c.update_and_attend(&q, k, v, scale, mask);
        }
        let (k, v) = self.update_and_fetch(k, v)?;
        crate::layers::sdpa::sdpa(&q, &k, &v, scale, mask.as_sdpa(), sinks)
    }

    /// Forgets the last `n` positions (mlx-lm's `trim`); false when this cache cannot (a
    /// rotating cache that has wrapped around its window, a recurrent state for any `n > 0` but
    /// positions of the pass it recorded).
    pub fn trim(&mut self, n: i32) -> bool {
        match self {
            Self::Standard(c) => c.trim(n),
            Self::Rotating(c) => c.trim(n),
            Self::Quantized(c) => c.trim(n),
            Self::State(c) => c.trim(n),
            Self::Chunked(c) => c.trim(n),
            Self::Pair(p) => p.iter_mut().all(|c| c.trim(n)),
        }
    }

    /// Whether the positions of a pass can be taken back afterwards (for speculative decoding):
    /// a plain cache's, and a recurrent state's once it records the pass
    /// ([`Self::record_steps`]); not a sliding-window ring's or a quantized cache's.
    pub fn can_take_back(&self) -> bool {
        match self {
            Self::Standard(_) | Self::State(_) => true,
            Self::Pair(p) => p.iter().all(Self::can_take_back),
            Self::Rotating(_) | Self::Quantized(_) | Self::Chunked(_) => false,
        }
    }

    /// Makes a recurrent state record the next pass, so that [`Self::trim`] can take back its
    /// positions; other caches need nothing.
    pub fn record_steps(&mut self) {
        match self {
            Self::State(c) => c.record_steps(),
            Self::Pair(p) => p.iter_mut().for_each(Self::record_steps),
            _ => {}
        }
    }

    /// With `kv_bits`: a plain cache becomes a quantized one (after each forward pass, as
    /// mlx-lm's `maybe_quantize_kv_cache` with `quantized_kv_start = 0`). Rotating caches and
    /// recurrent states stay.
    pub fn quantize(&mut self, bits: i32) -> Result<()> {
        if let Self::Standard(c) = self {
            *self = Self::Quantized(QuantizedCache::from_standard(c, KV_GROUP_SIZE, bits)?);
        }
        Ok(())
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            Self::Standard(c) => Box::new(c.arrays()),
            Self::Rotating(c) => Box::new(c.arrays()),
            Self::Quantized(c) => Box::new(c.arrays()),
            Self::State(c) => Box::new(c.arrays()),
            Self::Chunked(c) => Box::new(c.arrays()),
            Self::Pair(p) => Box::new(p.iter().flat_map(|c| c.arrays())),
        }
    }
}
