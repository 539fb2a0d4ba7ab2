//! KV caches, one per attention layer, and the attention mask each implies.
//!
//! Full-attention layers keep every position ([`StandardCache`](standard::StandardCache), mlx-lm's
//! `KVCache`), or, with `kv_bits`, keep them quantized
//! ([`QuantizedCache`](quantized::QuantizedCache), `QuantizedKVCache`); sliding-window layers keep
//! the last `window` positions in a ring ([`RotatingCache`](rotating::RotatingCache),
//! `RotatingKVCache`, never quantized: mlx-lm cannot quantize it either); linear-attention layers
//! keep a convolution window and a recurrent state instead ([`StateCache`], `ArraysCache`);
//! chunked-attention layers keep their chunk's positions ([`ChunkedCache`](chunked::ChunkedCache),
//! `ChunkedKVCache`). All
//! mirror mlx-lm's update rules exactly, because the order of keys in the cache and the mask shapes
//! decide the floating-point sums, and parity is token for token.

mod cache;
mod chunked;
mod mask;
mod padded;
mod pass;
mod quantized;
mod rotating;
mod size;
mod snapshot;
mod standard;
mod state;
mod stored;

pub use cache::{KvCache, KV_GROUP_SIZE};
pub use mask::{causal_mask, Mask};
pub use padded::PaddedCache;
pub use pass::{Attend, Caches, LayerKv, PassMasks, Positions, SharedKv};
pub use size::CacheSize;
pub use snapshot::Snapshot;
pub use state::StateCache;
pub use stored::{restore, store, Arrays, Layout};

#[cfg(test)]
mod tests;
