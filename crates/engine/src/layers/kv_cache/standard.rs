//! The cache of a full-attention layer: grown in steps of 256 positions as mlx-lm's `KVCache`
//! is, so decoding writes into preallocated space instead of concatenating every step.

use mlx_rs::{
    ops::{self, indexing::IndexOp, indexing::TryIndexMutOp},
    Array,
};

use crate::layers::array::Result;

/// Positions added to a cache's storage at a time.
pub(super) const STEP: i32 = 256;

/// Keys and values of one attention layer, shape `(B, kv_heads, capacity, head_dim)`.
#[derive(Clone, Default)]
pub struct StandardCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl StandardCache {
    /// Positions written so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Forgets the last `n` positions (later writes overwrite them).
    pub fn trim(&mut self, n: i32) -> bool {
        self.offset -= n.clamp(0, self.offset);
        true
    }

    /// Appends `(B, H, L, D)` keys and values; returns all keys and values so far.
    pub fn update_and_fetch(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let prev = self.offset;
        let len = k.dim(2);
        let capacity = self.keys.as_ref().map_or(0, |a| a.dim(2));
        if self.keys.is_none() || prev + len > capacity {
            let steps = (STEP + len - 1) / STEP;
            let grow = |x: &Array, old: Option<&Array>| -> Result<Array> {
                let shape = [x.dim(0), x.dim(1), steps * STEP, x.dim(3)];
                let fresh = ops::zeros_dtype(&shape, x.dtype())?;
                match old {
                    Some(old) => {
                        let old = if prev % STEP != 0 {
                            old.index((.., .., ..prev, ..))
                        } else {
                            old.clone()
                        };
                        ops::concatenate(&[old, fresh], 2)
                    }
                    None => Ok(fresh),
                }
            };
            self.keys = Some(grow(&k, self.keys.as_ref())?);
            self.values = Some(grow(&v, self.values.as_ref())?);
        }
        self.offset += len;
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        keys.try_index_mut((.., .., prev..self.offset, ..), &k)?;
        values.try_index_mut((.., .., prev..self.offset, ..), &v)?;
        Ok(self.state())
    }

    /// The written part of the cache.
    fn state(&self) -> (Array, Array) {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if self.offset < k.dim(2) {
            (
                k.index((.., .., ..self.offset, ..)),
                v.index((.., .., ..self.offset, ..)),
            )
        } else {
            (k.clone(), v.clone())
        }
    }

    /// Storage holding exactly `offset` positions (a cache cut at the front).
    pub(super) fn replace(&mut self, keys: Array, values: Array, offset: i32) {
        (self.keys, self.values, self.offset) = (Some(keys), Some(values), offset);
    }

    /// The whole storage, capacity included (what mlx-lm quantizes when converting).
    pub(super) fn storage(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// Arrays to evaluate after a prefill chunk.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    /// A cache of `offset` positions in `storage` (as [`Self::storage`] gives it).
    pub(super) fn holding(storage: Option<(Array, Array)>, offset: i32) -> Self {
        let mut cache = Self::default();
        if let Some((keys, values)) = storage {
            cache.replace(keys, values, offset);
        }
        cache
    }
}
