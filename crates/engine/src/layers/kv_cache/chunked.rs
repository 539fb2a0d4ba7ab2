//! The cache of a chunked-attention layer (Llama 4's local layers): a position attends only to
//! the positions of its own chunk of `chunk` (`attention_chunk_size`) up to itself. As mlx-lm's
//! `ChunkedKVCache`, the cache keeps the positions from `start` on: when a pass begins with more
//! than `chunk` positions held, the oldest are dropped until `chunk` remain; the pass's own are
//! appended (storage grown in steps of 256, as the standard cache's); the mask confines each
//! query to its chunk. The keys attended, and so the floating-point sums, are mlx-lm's.

use mlx_rs::{ops::indexing::IndexOp, Array};

use super::{mask::Mask, standard::StandardCache};
use crate::layers::array::Result;

#[derive(Clone)]
pub struct ChunkedCache {
    /// Positions `start..offset`, at `0..offset - start`.
    kept: StandardCache,
    /// The first position held.
    start: i32,
    chunk: i32,
}

impl ChunkedCache {
    pub fn new(chunk: i32) -> Self {
        Self {
            kept: StandardCache::default(),
            start: 0,
            chunk,
        }
    }

    /// Positions seen so far.
    /// Positions of one chunk: the most kept.
    pub fn chunk(&self) -> i32 {
        self.chunk
    }

    pub fn offset(&self) -> i32 {
        self.start + self.kept.offset()
    }

    /// The first position held once a pass begins (mlx-lm's `maybe_trim_front`).
    fn start_of_pass(&self) -> i32 {
        self.start.max(self.offset() - self.chunk)
    }

    /// Forgets the last `n` positions, possible while no position has been dropped at the front
    /// (as a sliding window's ring only until it wraps): once it has, the positions held sit at
    /// other places in the keys than a fresh prefill would put them, so a pass after a cut would
    /// sum in another order than a fresh one (mlx-lm cuts anyway).
    pub fn trim(&mut self, n: i32) -> bool {
        let n = n.max(0);
        if n > 0 && self.start > 0 {
            return false;
        }
        self.kept.trim(n)
    }

    /// For `n` queries from the current offset: key `j` (from the pass's first held position)
    /// may be seen by query `i` when both are in one chunk and `j <= i` (mlx-lm's
    /// `chunk_mask`, an array even for one query).
    pub fn mask(&self, n: i32) -> Mask {
        let (start, offset, chunk) = (self.start_of_pass(), self.offset(), self.chunk);
        let allowed: Vec<bool> = (offset..offset + n)
            .flat_map(|i| (start..offset + n).map(move |j| j / chunk == i / chunk && j <= i))
            .collect();
        Mask::Array(Array::from_slice(&allowed, &[n, offset + n - start]))
    }

    /// Drops the positions before the pass's start, then appends `(B, H, L, D)` keys and values;
    /// returns those held.
    pub fn update_and_fetch(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let drop = self.start_of_pass() - self.start;
        if drop > 0 {
            self.kept.drop_front(drop)?;
            self.start += drop;
        }
        self.kept.update_and_fetch(k, v)
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.kept.arrays()
    }

    /// The positions held and the first one's index, for storing.
    pub(super) fn parts(&self) -> (&StandardCache, i32) {
        (&self.kept, self.start)
    }

    /// A cache of `chunk` holding `kept` from position `start` on.
    pub(super) fn from_parts(chunk: i32, kept: StandardCache, start: i32) -> Self {
        Self { kept, start, chunk }
    }
}

impl StandardCache {
    /// Forgets the first `n` positions written: the storage becomes the rest of what was
    /// written (mlx-lm's `keys[..., n:offset, :]`), grown again by the next update.
    pub(super) fn drop_front(&mut self, n: i32) -> Result<()> {
        let Some((keys, values)) = self.storage() else {
            return Ok(());
        };
        let end = self.offset();
        let (keys, values) = (
            keys.index((.., .., n..end, ..)),
            values.index((.., .., n..end, ..)),
        );
        self.replace(keys, values, end - n);
        Ok(())
    }
}
