//! How one forward pass's rows map onto caches: the batching mode lives here, not in the model.
//! A model runs one forward over its input and a [`Caches`]; each layer takes its [`LayerKv`]
//! view, and the view rotates, stores and attends for every sequence of the pass as that
//! sequence alone would (mlx-lm's models likewise hand the cache to the attention, whose
//! `update_and_fetch` and mask decide the rest).
//!
//! The kinds: one sequence ([`Caches::One`]); a decode step of several sequences, row by row
//! ([`Caches::Rows`]: projections and MLPs over all rows at once, RoPE, the cache update and
//! attention per row, the bit-exact CPU batch); several sequences' prefill chunks along the
//! sequence axis ([`Caches::Segments`]); and a decode step over one padded array per layer
//! ([`Caches::Padded`]: one scatter and one attention call for all rows).

use mlx_rs::{error::Exception, ops, ops::indexing::IndexOp, Array};

use super::{
    cache::KvCache,
    mask::Mask,
    padded::{PaddedCache, PaddedStep},
};
use crate::layers::{
    array::{split_rows, Result},
    sdpa::{sdpa, sdpa_padded},
};

/// The caches a forward pass appends to.
pub enum Caches<'a> {
    /// One sequence: one cache per layer.
    One(&'a mut [KvCache]),
    /// One decode step of several sequences: input `(B, 1)`, row `b` continuing `caches[b]`.
    Rows(&'a mut [&'a mut [KvCache]]),
    /// Prefill chunks of several sequences in one pass: input `(1, ΣL)`, sequence `s`'s
    /// `lens[s]` positions in turn continuing `caches[s]`. The logits are those of each
    /// sequence's last position.
    Segments(&'a mut [&'a mut [KvCache]], &'a [i32]),
    /// One decode step of a batch whose full-attention caches are one padded array per layer.
    Padded(&'a mut PaddedCache),
}

/// What every layer of one pass shares: the masks, one per kind of layer (asked of each kind's
/// first cache before any layer adds this pass's positions, as mlx-lm's
/// `create_attention_mask`), per sequence; or the padded step.
pub enum PassMasks {
    Sequences(Vec<Vec<Mask>>),
    Padded(PaddedStep),
}

impl Caches<'_> {
    /// Checks every sequence has one cache per layer (`layers` of them).
    pub fn check(&self, layers: usize) -> Result<()> {
        let counts: Vec<usize> = match self {
            Self::One(c) => vec![c.len()],
            Self::Rows(rows) => rows.iter().map(|c| c.len()).collect(),
            Self::Segments(seqs, lens) if seqs.len() != lens.len() => {
                return Err(Exception::custom(
                    "one length and one KV cache per layer for each sequence",
                ))
            }
            Self::Segments(seqs, _) => seqs.iter().map(|c| c.len()).collect(),
            Self::Padded(_) => return Ok(()),
        };
        match counts.iter().find(|&&n| n != layers) {
            Some(n) => Err(Exception::custom(format!(
                "{layers} layers need one KV cache each, got {n}"
            ))),
            None => Ok(()),
        }
    }

    /// Whether several sequences share this pass.
    pub fn is_batch(&self) -> bool {
        !matches!(self, Self::One(_))
    }

    /// The pass's masks for `n` positions (one sequence's), one per kind of layer, each asked
    /// of the kind's first layer (`sources`).
    pub fn masks(&mut self, sources: &[usize], n: i32) -> Result<PassMasks> {
        let of = |c: &[KvCache], n: i32| sources.iter().map(|&i| c[i].mask(n)).collect();
        Ok(PassMasks::Sequences(match self {
            Self::One(c) => vec![of(c, n)?],
            Self::Rows(rows) => (rows.iter()).map(|c| of(c, 1)).collect::<Result<_>>()?,
            Self::Segments(seqs, lens) => (seqs.iter().zip(lens.iter()))
                .map(|(c, &n)| of(c, n))
                .collect::<Result<_>>()?,
            Self::Padded(cache) => return Ok(PassMasks::Padded(cache.step()?)),
        }))
    }

    /// The first layer's position offset of a single sequence (M-RoPE's positions without
    /// explicit ones).
    pub fn offset(&self) -> i32 {
        match self {
            Self::One(c) => c.first().map_or(0, KvCache::offset),
            _ => 0,
        }
    }

    /// Layer `layer`'s view, under mask kind `kind`.
    pub fn layer<'p>(
        &'p mut self,
        layer: usize,
        kind: usize,
        masks: &'p PassMasks,
    ) -> Result<LayerKv<'p>> {
        let mismatch = || Exception::custom("a pass's masks do not match its caches");
        Ok(match (self, masks) {
            (Self::One(c), PassMasks::Sequences(m)) => LayerKv::Cache(&mut c[layer], &m[0][kind]),
            (Self::Rows(rows), PassMasks::Sequences(m)) => LayerKv::Rows(
                (rows.iter_mut().zip(m))
                    .map(|(c, m)| (&mut c[layer], &m[kind]))
                    .collect(),
            ),
            (Self::Segments(seqs, lens), PassMasks::Sequences(m)) => LayerKv::Segments(
                (seqs.iter_mut().zip(m).zip(lens.iter()))
                    .map(|((c, m), &n)| (&mut c[layer], &m[kind], n))
                    .collect(),
            ),
            (Self::Padded(cache), PassMasks::Padded(step)) => LayerKv::Padded(cache, layer, step),
            _ => return Err(mismatch()),
        })
    }

    /// The hidden states `(B, L, D)` the head reads: each segment's last position for
    /// [`Caches::Segments`] (lazy: a chunk before a prompt's last never computes them), all
    /// of them otherwise.
    pub fn head_positions(&self, h: Array) -> Result<Array> {
        match self {
            Self::Segments(_, lens) => {
                let ends: Vec<i32> = (lens.iter())
                    .scan(0, |end, &n| {
                        *end += n;
                        Some(*end - 1)
                    })
                    .collect();
                h.take_axis(Array::from_slice(&ends, &[ends.len() as i32]), 1)
            }
            _ => Ok(h),
        }
    }
}

/// A layer's keys and values after this pass's update (as its cache holds them) and the offset
/// the pass started at: what Gemma 4's KV-shared layers attend to.
#[derive(Clone)]
pub struct SharedKv {
    pub keys: Array,
    pub values: Array,
    pub offset: i32,
}

/// Where one layer's attention gets its keys and values in this pass.
pub enum LayerKv<'a> {
    /// Its own cache, with its mask.
    Cache(&'a mut KvCache, &'a Mask),
    /// An earlier layer's keys and values of this pass, with that kind's mask.
    Shared(&'a SharedKv, &'a Mask),
    /// One cache per row of a decode step, each with its mask.
    Rows(Vec<(&'a mut KvCache, &'a Mask)>),
    /// One cache per sequence along the pass's sequence axis, each with its mask and length.
    Segments(Vec<(&'a mut KvCache, &'a Mask, i32)>),
    /// Layer `.1` of a batch's padded cache, in step `.2`.
    Padded(&'a mut PaddedCache, usize, &'a PaddedStep),
}

/// How a layer places its queries and keys at their positions (RoPE, or given angles) and
/// scales its queries there: what the cache kinds call for each sequence's part.
pub trait Positions {
    /// Queries or keys `(B, H, L, D)` of a sequence whose pass starts at `offset`.
    fn rotate(&self, x: Array, offset: i32) -> Result<Array>;
    /// Queries or keys of a batch's rows, row `b` at `offsets[b]` (`(B,)` int32).
    fn rotate_rows(&self, x: Array, offsets: &Array) -> Result<Array>;
    /// Queries `q` scaled for a pass starting at `offset`, if the layer scales them.
    fn temper(&self, q: Array, offset: i32) -> Result<Array>;
    /// Whether [`Self::temper`] changes anything (a padded step cannot scale per row).
    fn tempers(&self) -> bool;
}

/// A layer's attention settings the cache kinds need.
pub struct Attend<'a> {
    pub scale: f32,
    pub sinks: Option<&'a Array>,
    /// Keep this pass's keys and values for later layers ([`SharedKv`]).
    pub keep: bool,
}

impl LayerKv<'_> {
    /// Attention `(B, H, L, D)` of queries `q` over this pass's keys `k` and values `v` (none
    /// for a KV-shared layer) and what the cache holds, each sequence at its own positions
    /// under its own mask; with `how.keep`, also the keys and values for later layers.
    pub fn attend(
        self,
        q: Array,
        kv: Option<(Array, Array)>,
        at: &impl Positions,
        how: &Attend,
    ) -> Result<(Array, Option<SharedKv>)> {
        let (scale, sinks) = (how.scale, how.sinks);
        let Some((k, v)) = kv else {
            let Self::Shared(shared, mask) = self else {
                return Err(Exception::custom(
                    "only a KV-shared layer attends without keys of its own",
                ));
            };
            // The sharing layer's rotation, at its offset, for the queries alone.
            let q = at.temper(at.rotate(q, shared.offset)?, shared.offset)?;
            let out = sdpa(
                &q,
                &shared.keys,
                &shared.values,
                scale,
                mask.as_sdpa(),
                sinks,
            )?;
            return Ok((out, None));
        };
        match self {
            Self::Cache(cache, mask) => {
                let offset = cache.offset();
                let (q, k) = (at.rotate(q, offset)?, at.rotate(k, offset)?);
                let q = at.temper(q, offset)?;
                if !how.keep {
                    let out = cache.update_and_attend(q, k, v, scale, mask, sinks)?;
                    return Ok((out, None));
                }
                let (keys, values) = cache.update_and_fetch(k, v)?;
                let out = sdpa(&q, &keys, &values, scale, mask.as_sdpa(), sinks)?;
                let kept = SharedKv {
                    keys,
                    values,
                    offset,
                };
                Ok((out, Some(kept)))
            }
            Self::Shared(..) => Err(Exception::custom(
                "a KV-shared layer has no keys and values of its own",
            )),
            Self::Rows(rows) => {
                let offsets: Vec<i32> = rows.iter().map(|(cache, _)| cache.offset()).collect();
                // One rotation of all rows' queries and keys, each at its own position.
                let all = Array::from_slice(&offsets, &[offsets.len() as i32]);
                let (q, k) = (at.rotate_rows(q, &all)?, at.rotate_rows(k, &all)?);
                let parts = (split_rows(&q).into_iter())
                    .zip(split_rows(&k))
                    .zip(split_rows(&v));
                let outs = (rows.into_iter().zip(offsets).zip(parts))
                    .map(|(((cache, mask), offset), ((q, k), v))| {
                        let q = at.temper(q, offset)?;
                        cache.update_and_attend(q, k, v, scale, mask, sinks)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((ops::concatenate(&outs, 0)?, None))
            }
            Self::Segments(segments) => {
                let mut start = 0;
                let mut outs = Vec::with_capacity(segments.len());
                for (cache, mask, len) in segments {
                    let part = |a: &Array| a.index((.., .., start..start + len, ..));
                    let offset = cache.offset();
                    let (q, k) = (at.rotate(part(&q), offset)?, at.rotate(part(&k), offset)?);
                    let q = at.temper(q, offset)?;
                    outs.push(cache.update_and_attend(q, k, part(&v), scale, mask, sinks)?);
                    start += len;
                }
                Ok((ops::concatenate(&outs, 2)?, None))
            }
            Self::Padded(cache, layer, step) => {
                if at.tempers() {
                    return Err(Exception::custom(
                        "a layer with an attention temperature attends row by row",
                    ));
                }
                let (q, k) = (
                    at.rotate_rows(q, &step.offsets)?,
                    at.rotate_rows(k, &step.offsets)?,
                );
                let (keys, values) = cache.update(layer, step, &k, &v)?;
                let out = sdpa_padded(&q, &keys, &values, scale, &step.mask, &step.lens, sinks)?;
                Ok((out, None))
            }
        }
    }

    /// A layer that attends its own way, one sequence at a time (linear attention with its
    /// state, multi-head latent attention over its latent cache): `f` over each sequence's
    /// part of `x` `(B, L, D)`, its cache and its mask, the parts' outputs joined back.
    pub fn each_sequence(
        self,
        x: &Array,
        mut f: impl FnMut(&Array, &mut KvCache, &Mask) -> Result<Array>,
    ) -> Result<Array> {
        match self {
            Self::Cache(cache, mask) => f(x, cache, mask),
            Self::Rows(rows) => {
                let outs = (rows.into_iter().zip(split_rows(x)))
                    .map(|((cache, mask), x)| f(&x, cache, mask))
                    .collect::<Result<Vec<_>>>()?;
                ops::concatenate(&outs, 0)
            }
            Self::Segments(segments) => {
                let mut start = 0;
                let mut outs = Vec::with_capacity(segments.len());
                for (cache, mask, len) in segments {
                    outs.push(f(&x.index((.., start..start + len, ..)), cache, mask)?);
                    start += len;
                }
                ops::concatenate(&outs, 1)
            }
            Self::Shared(..) | Self::Padded(..) => Err(Exception::custom(
                "this layer attends one sequence at a time, over a cache of its own",
            )),
        }
    }
}
