//! The full-attention caches of several sequences of a batch in one array per layer, rows
//! right-padded: row `b` holds its sequence's positions `0..offsets[b]`, the rest is masked.
//! A decode step then writes every row's new key and value with one scatter per layer and
//! attends with one call, where row-by-row attention takes a cache update and an attention
//! call per row and layer ([`crate::BatchAttention`]; docs/decisions/batching.md).
//!
//! Rows join with their sequence's [`StandardCache`]s (copied in) and leave with them (copied
//! out, as the same caches a lone run would hold); rows are re-laid-out only then.

use mlx_rs::{
    error::Exception,
    ops::{self, indexing::IndexOp},
    transforms, Array,
};

use super::{
    cache::KvCache,
    standard::{StandardCache, STEP},
};
use crate::layers::array::Result;

/// Keys and values `(B, H, capacity, D)` of every layer, one row per sequence.
#[derive(Default)]
pub struct PaddedCache {
    /// The sequence of each row (the caller's ids).
    ids: Vec<usize>,
    /// Positions written in each row.
    offsets: Vec<i32>,
    /// Per layer: keys and values; empty while no row is held.
    layers: Vec<(Array, Array)>,
}

/// What every layer of one decode step shares: where each row writes and what it may see.
pub struct PaddedStep {
    /// `(B,)` int32: each row's position (its RoPE offset).
    pub offsets: Array,
    /// `(B, 1, 1, 1)` int32: the same, as indices for the scatter along the position axis.
    at: Array,
    /// `(B, 1, 1, len)` booleans: row `b` sees positions `0..=offsets[b]`.
    pub mask: Array,
    /// Positions each row attends to, this step's included (`offsets[b] + 1`).
    pub lens: Vec<i32>,
    /// Positions attended to: the longest row's, this step's included.
    len: i32,
}

impl PaddedCache {
    /// The sequences held, in row order.
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }

    /// Whether `caches` can join: every layer a full-attention cache with positions written.
    pub fn fits(caches: &[KvCache]) -> bool {
        !caches.is_empty()
            && (caches.iter()).all(
                |c| matches!(c, KvCache::Standard(s) if s.offset() > 0 && s.storage().is_some()),
            )
    }

    /// Adds sequence `id` as the last row, its caches copied in (check [`Self::fits`] first).
    pub fn join(&mut self, id: usize, caches: &[KvCache]) -> Result<()> {
        let stores = (caches.iter())
            .map(|c| match c {
                KvCache::Standard(s) => {
                    s.storage().map(|(k, v)| (k.clone(), v.clone(), s.offset()))
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Exception::custom("only full-attention caches join a padded batch"))?;
        let offset = stores[0].2;
        if !self.layers.is_empty() && stores.len() != self.layers.len() {
            return Err(Exception::custom(format!(
                "a padded batch of {} layers cannot take {} caches",
                self.layers.len(),
                stores.len()
            )));
        }
        let capacity = self.capacity().max(round_up(offset + 1));
        self.grow(capacity)?;
        let fit = |x: &Array| fit(x, capacity);
        self.layers = if self.layers.is_empty() {
            let rows = stores.iter().map(|(k, v, _)| Ok((fit(k)?, fit(v)?)));
            rows.collect::<Result<_>>()?
        } else {
            (self.layers.iter().zip(&stores))
                .map(|((keys, values), (k, v, _))| {
                    Ok((
                        ops::concatenate(&[keys, &fit(k)?], 0)?,
                        ops::concatenate(&[values, &fit(v)?], 0)?,
                    ))
                })
                .collect::<Result<_>>()?
        };
        self.ids.push(id);
        self.offsets.push(offset);
        Ok(())
    }

    /// Keeps the rows of the ids `keep` accepts, in order; each other row is handed to `out`
    /// with its caches (copies: what the sequence's own caches would hold).
    pub fn retain(
        &mut self,
        mut keep: impl FnMut(usize) -> bool,
        mut out: impl FnMut(usize, Vec<KvCache>),
    ) -> Result<()> {
        let kept: Vec<i32> = (0..self.ids.len() as i32)
            .filter(|&r| keep(self.ids[r as usize]))
            .collect();
        if kept.len() == self.ids.len() {
            return Ok(());
        }
        for r in 0..self.ids.len() {
            if !kept.contains(&(r as i32)) {
                out(self.ids[r], self.row(r)?);
            }
        }
        if kept.is_empty() {
            *self = Self::default();
            return Ok(());
        }
        // The rows left keep the capacity they need (a long row leaving frees its length).
        let longest = kept
            .iter()
            .map(|&r| self.offsets[r as usize])
            .max()
            .unwrap_or(0);
        let capacity = self.capacity().min(round_up(longest + 1));
        let at = Array::from_slice(&kept, &[kept.len() as i32]);
        for (keys, values) in &mut self.layers {
            *keys = fit(keys, capacity)?.take_axis(&at, 0)?;
            *values = fit(values, capacity)?.take_axis(&at, 0)?;
        }
        self.ids = kept.iter().map(|&r| self.ids[r as usize]).collect();
        self.offsets = kept.iter().map(|&r| self.offsets[r as usize]).collect();
        Ok(())
    }

    /// Row `r`'s caches, copied out and evaluated: a lazy copy would keep every row's arrays
    /// alive (in the prompt cache, say) until it ran.
    fn row(&self, r: usize) -> Result<Vec<KvCache>> {
        let (b, n) = (r as i32, self.offsets[r]);
        let caches = (self.layers.iter())
            .map(|(keys, values)| {
                let mut cache = StandardCache::default();
                cache.update_and_fetch(
                    keys.index((b..b + 1, .., ..n, ..)),
                    values.index((b..b + 1, .., ..n, ..)),
                )?;
                Ok(KvCache::Standard(cache))
            })
            .collect::<Result<Vec<_>>>()?;
        transforms::eval(caches.iter().flat_map(KvCache::arrays))?;
        Ok(caches)
    }

    /// Starts a decode step of one new position per row: room for it, and what the layers
    /// share. The offsets advance here; every layer must then [`Self::update`] once.
    pub fn step(&mut self) -> Result<PaddedStep> {
        let len = self.offsets.iter().max().map_or(0, |&o| o + 1);
        self.grow(round_up(len))?;
        let b = self.offsets.len() as i32;
        let mask: Vec<bool> = (self.offsets.iter())
            .flat_map(|&o| (0..len).map(move |j| j <= o))
            .collect();
        let step = PaddedStep {
            offsets: Array::from_slice(&self.offsets, &[b]),
            at: Array::from_slice(&self.offsets, &[b, 1, 1, 1]),
            mask: Array::from_slice(&mask, &[b, 1, 1, len]),
            lens: self.offsets.iter().map(|&o| o + 1).collect(),
            len,
        };
        for o in &mut self.offsets {
            *o += 1;
        }
        Ok(step)
    }

    /// Layer `layer`'s update: writes row `b`'s key and value `(B, H, 1, D)` at its position;
    /// returns the keys and values `(B, H, len, D)` to attend to with `step.mask`.
    pub fn update(
        &mut self,
        layer: usize,
        step: &PaddedStep,
        k: &Array,
        v: &Array,
    ) -> Result<(Array, Array)> {
        let (keys, values) = (self.layers.get_mut(layer))
            .ok_or_else(|| Exception::custom("a padded batch has fewer layers than the model"))?;
        *keys = keys.put_along_axis(&step.at, k, 2)?;
        *values = values.put_along_axis(&step.at, v, 2)?;
        let len = step.len;
        Ok((
            keys.index((.., .., ..len, ..)),
            values.index((.., .., ..len, ..)),
        ))
    }

    fn capacity(&self) -> i32 {
        self.layers.first().map_or(0, |(k, _)| k.dim(2))
    }

    /// Makes every layer hold at least `capacity` positions (zeros added at the end).
    fn grow(&mut self, capacity: i32) -> Result<()> {
        if self.layers.is_empty() || capacity <= self.capacity() {
            return Ok(());
        }
        for (keys, values) in &mut self.layers {
            *keys = fit(keys, capacity)?;
            *values = fit(values, capacity)?;
        }
        Ok(())
    }
}

/// `x` `(B, H, S, D)` cut or zero-padded to `capacity` positions.
fn fit(x: &Array, capacity: i32) -> Result<Array> {
    let have = x.dim(2);
    match have.cmp(&capacity) {
        std::cmp::Ordering::Equal => Ok(x.clone()),
        std::cmp::Ordering::Greater => Ok(x.index((.., .., ..capacity, ..))),
        std::cmp::Ordering::Less => {
            let shape = [x.dim(0), x.dim(1), capacity - have, x.dim(3)];
            ops::concatenate(&[x, &ops::zeros_dtype(&shape, x.dtype())?], 2)
        }
    }
}

/// `n` rounded up to whole steps of storage.
fn round_up(n: i32) -> i32 {
    (n + STEP - 1) / STEP * STEP
}
