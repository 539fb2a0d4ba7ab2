//! The cache of a sliding-window layer: mlx-lm's `RotatingKVCache` with `keep = 0`.
//!
//! Multi-token updates (prefill) put the cache in temporal order, keep its last `window - 1`
//! positions and append, so every new query still sees a full window (the cache briefly holds
//! up to `window - 1 + L` positions, and the mask cuts each query's view to its window).
//! Single-token updates (decoding) grow the storage to `window` positions in steps of 256, then
//! overwrite the oldest slot in a ring; the one query then attends to all of it, unmasked.

use mlx_rs::{
    ops::{self, indexing::IndexOp, indexing::TryIndexMutOp},
    Array,
};

use super::{
    mask::{causal_mask, Mask},
    standard::STEP,
};
use crate::layers::array::Result;

#[derive(Clone)]
pub struct RotatingCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions seen so far.
    offset: i32,
    /// The window: positions kept.
    max_size: i32,
    /// The next write slot in the ring (or the stored length after a multi-token update).
    idx: i32,
}

impl RotatingCache {
    pub fn new(window: i32) -> Self {
        Self {
            keys: None,
            values: None,
            offset: 0,
            max_size: window,
            idx: 0,
        }
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Its storage (the ring as it lies), offset and write slot, for storing it whole.
    pub(super) fn parts(&self) -> (Option<(&Array, &Array)>, i32, i32) {
        let storage = self.keys.as_ref().zip(self.values.as_ref());
        (storage, self.offset, self.idx)
    }

    /// A cache of `window` holding what [`Self::parts`] gave.
    pub(super) fn from_parts(
        window: i32,
        storage: Option<(Array, Array)>,
        offset: i32,
        idx: i32,
    ) -> Self {
        let (keys, values) = storage.unzip();
        Self {
            keys,
            values,
            offset,
            max_size: window,
            idx,
        }
    }

    /// Positions kept.
    pub fn window(&self) -> i32 {
        self.max_size
    }

    /// Forgets the last `n` positions, possible while nothing has been overwritten yet
    /// (mlx-lm: trimmable while `offset < max_size`).
    pub fn trim(&mut self, n: i32) -> bool {
        let n = n.clamp(0, self.offset);
        if n > 0 && self.offset >= self.max_size {
            return false;
        }
        self.offset -= n;
        self.idx -= n;
        true
    }

    /// `n > 1`: causal, windowed once the queries reach past the window; `n == 1`: none (the
    /// cache holds exactly the window).
    pub fn mask(&self, n: i32) -> Result<Mask> {
        if n <= 1 {
            return Ok(Mask::None);
        }
        let offset = (self.max_size - 1).min(self.offset);
        Ok(match offset + n > self.max_size {
            true => Mask::Array(causal_mask(n, offset, Some(self.max_size))),
            false => Mask::Causal,
        })
    }

    pub fn update_and_fetch(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        match k.dim(2) {
            1 => self.update_in_place(k, v),
            _ => self.update_concat(k, v),
        }
    }

    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }

    fn update_concat(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let len = k.dim(2);
        let (keys, values) = match (self.keys.take(), self.values.take()) {
            (Some(old_k), Some(old_v)) => {
                let old_k = self.temporal_order(old_k)?;
                let old_v = self.temporal_order(old_v)?;
                // Keep `max_size - 1` old positions so each new query sees a full window.
                let trim = old_k.dim(2) - self.max_size + 1;
                (
                    trim_append(trim, &old_k, &k)?,
                    trim_append(trim, &old_v, &v)?,
                )
            }
            _ => (k, v),
        };
        self.offset += len;
        self.idx = keys.dim(2);
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        Ok((keys, values))
    }

    fn update_in_place(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let len = k.dim(2);
        let prev = self.offset;
        let stored = self.keys.as_ref().map(|a| a.dim(2));
        if stored.is_none_or(|s| prev >= s && s < self.max_size) {
            let grow = (STEP).min(self.max_size - prev);
            let extend = |x: &Array, old: Option<Array>| -> Result<Array> {
                let fresh = ops::zeros_dtype(&[x.dim(0), x.dim(1), grow, x.dim(3)], x.dtype())?;
                match old {
                    Some(old) => ops::concatenate(&[old, fresh], 2),
                    None => Ok(fresh),
                }
            };
            self.keys = Some(extend(&k, self.keys.take())?);
            self.values = Some(extend(&v, self.values.take())?);
            self.idx = prev;
        }
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        let trim = keys.dim(2) - self.max_size;
        if trim > 0 {
            *keys = keys.index((.., .., trim.., ..));
            *values = values.index((.., .., trim.., ..));
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = 0;
        }
        keys.try_index_mut((.., .., self.idx..self.idx + len, ..), &k)?;
        values.try_index_mut((.., .., self.idx..self.idx + len, ..), &v)?;
        self.offset += len;
        self.idx += len;
        Ok(match self.offset < keys.dim(2) {
            true => (
                keys.index((.., .., ..self.offset, ..)),
                values.index((.., .., ..self.offset, ..)),
            ),
            false => (keys.clone(), values.clone()),
        })
    }

    /// The stored positions oldest first, unused slots dropped.
    fn temporal_order(&self, x: Array) -> Result<Array> {
        let stored = x.dim(2);
        if self.idx == stored {
            Ok(x)
        } else if self.idx < self.offset {
            let newer = x.index((.., .., self.idx.., ..));
            let older = x.index((.., .., ..self.idx, ..));
            ops::concatenate(&[newer, older], 2)
        } else {
            Ok(x.index((.., .., ..self.idx, ..)))
        }
    }
}

/// Drops the oldest `trim` positions (if positive) and appends `new`.
fn trim_append(trim: i32, old: &Array, new: &Array) -> Result<Array> {
    let kept = match trim > 0 {
        true => old.index((.., .., trim.., ..)),
        false => old.clone(),
    };
    ops::concatenate(&[kept, new.clone()], 2)
}
