//! Self-attention as a layer: projections, q/k norms, RoPE, the KV cache, scaled dot-product
//! attention, the output projection.

use mlx_rs::{fast, ops, ops::indexing::IndexOp, Array};

use crate::layers::{
    array::split_rows,
    array::Result,
    kv_cache::{KvCache, Mask, PaddedCache, PaddedStep},
    linear::Linear,
    norm::RmsNorm,
    rope::{Rope, RotaryAngles},
};

/// The query/key/value projections: separate matrices, or one fused `[q; k; v]` (Phi-3).
#[derive(Debug)]
pub enum Qkv {
    Split {
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
    },
    Fused {
        qkv_proj: Linear,
    },
    /// No value projection: the key projection gives the values too, before the key norm
    /// (Gemma 4's `attention_k_eq_v` layers).
    KeyIsValue {
        q_proj: Linear,
        k_proj: Linear,
    },
    /// Queries only: the layer attends to another layer's keys and values ([`SharedKv`]).
    QueryOnly {
        q_proj: Linear,
    },
}

/// A layer's keys and values after this pass's update (as its cache holds them) and the offset
/// the pass started at: what Gemma 4's KV-shared layers attend to.
#[derive(Clone)]
pub struct SharedKv {
    pub keys: Array,
    pub values: Array,
    pub offset: i32,
}

/// RMS norms over the queries and keys, before RoPE.
#[derive(Debug)]
pub enum QkNorm {
    /// Over each head's features (Qwen3, Gemma 3); no key norm in a layer without keys of its
    /// own (Gemma 4's KV-shared layers).
    PerHead(RmsNorm, Option<RmsNorm>),
    /// Over the whole projection, all heads at once (OLMoE).
    Whole(RmsNorm, RmsNorm),
}

/// Which features q/k norms cover (a layer spec's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNormOver {
    Head,
    Projection,
}

impl QkNorm {
    pub fn new(over: QkNormOver, q: RmsNorm, k: RmsNorm) -> Self {
        match over {
            QkNormOver::Head => Self::PerHead(q, Some(k)),
            QkNormOver::Projection => Self::Whole(q, k),
        }
    }
}

/// Self-attention: projections, optional q/k RMS norms (Qwen3, Gemma 3, OLMoE), RoPE, the
/// KV cache, scaled dot-product attention, output projection. The mask comes from the caller,
/// built once per forward pass for all layers of one window kind (mlx-lm's model files do the
/// same with `create_attention_mask`).
pub struct Attention {
    pub qkv: Qkv,
    pub o_proj: Linear,
    pub qk_norm: Option<QkNorm>,
    pub shape: AttentionShape,
    /// `None`: no positional encoding in this layer (SmolLM3's NoPE layers).
    pub rope: Option<Rope>,
    /// One learned logit per query head that joins every softmax over the keys and takes its
    /// share of the weight without a value (GPT-OSS's attention sinks).
    pub sinks: Option<Array>,
    /// Values RMS-normalised over each head's features without a scale, with this epsilon
    /// (Gemma 4).
    pub v_norm_eps: Option<f32>,
    /// Each head's query projection is followed by as many gate features, and the attention
    /// output is multiplied by their sigmoid before `o_proj` (Qwen3-Next).
    pub output_gate: bool,
}

impl Attention {
    /// `mask` is this layer's cache's mask for `x`'s length, asked before the update
    /// ([`KvCache::mask`]). `angles`: the pass's rotary angles when positions are given
    /// explicitly (M-RoPE), else RoPE runs at the cache's offset. With `keep`, also the keys
    /// and values after the cache's update, for the layers that share them.
    pub fn forward(
        &self,
        x: &Array,
        mask: &Mask,
        cache: &mut KvCache,
        angles: Option<&RotaryAngles>,
        keep: bool,
    ) -> Result<(Array, Option<SharedKv>)> {
        let s = &self.shape;
        let (q, k, v, gate) = self.project(x)?;
        let offset = cache.offset();
        let (q, k) = s.rotate(q, k, self.rope.as_ref(), angles, offset)?;
        let q = s.temper(q, offset)?;
        if !keep {
            let out = cache.update_and_attend(q, k, v, s.scale, mask, self.sinks.as_ref())?;
            return Ok((self.output(out, gate.as_ref())?, None));
        }
        let (keys, values) = cache.update_and_fetch(k, v)?;
        let kv = SharedKv {
            keys,
            values,
            offset,
        };
        Ok((self.attend_to(q, &kv, mask, gate.as_ref())?, Some(kv)))
    }

    /// One decode step of a batch: `x` `(B, 1, D)` projected for all rows at once, then row `b`
    /// rotated at, stored into and attending over `rows[b]`'s cache with its mask, as
    /// [`Self::forward`] does for one sequence; the rows' outputs through `o_proj` together.
    pub fn forward_rows(&self, x: &Array, rows: Vec<(&mut KvCache, &Mask)>) -> Result<Array> {
        let s = &self.shape;
        let (q, k, v, gate) = self.project(x)?;
        let offsets: Vec<i32> = rows.iter().map(|(cache, _)| cache.offset()).collect();
        // One rotation of all rows' queries and keys, each at its own position.
        let at = Array::from_slice(&offsets, &[offsets.len() as i32]);
        let (q, k) = self.rotate_rows(q, k, &at)?;
        let parts = split_rows(&q)
            .into_iter()
            .zip(split_rows(&k))
            .zip(split_rows(&v));
        let outs = (rows.into_iter().zip(offsets).zip(parts))
            .map(|(((cache, mask), offset), ((q, k), v))| {
                let q = s.temper(q, offset)?;
                cache.update_and_attend(q, k, v, s.scale, mask, self.sinks.as_ref())
            })
            .collect::<Result<Vec<_>>>()?;
        self.output(ops::concatenate(&outs, 0)?, gate.as_ref())
    }

    /// Prefill chunks of several sequences in one pass: `x` `(1, ΣL, D)` holds each sequence's
    /// positions in turn (`segments[s]`: its cache, mask and length), projected together; each
    /// segment then rotated at its cache's offset, stored and attending over its own cache with
    /// its own mask, exactly as [`Self::forward`] does for that chunk alone; the outputs through
    /// `o_proj` together.
    pub fn forward_segments(
        &self,
        x: &Array,
        segments: Vec<(&mut KvCache, &Mask, i32)>,
    ) -> Result<Array> {
        let s = &self.shape;
        let (q, k, v, gate) = self.project(x)?;
        let mut start = 0;
        let mut outs = Vec::with_capacity(segments.len());
        for (cache, mask, len) in segments {
            let part = |a: &Array| a.index((.., .., start..start + len, ..));
            let offset = cache.offset();
            let (q, k) = s.rotate(part(&q), part(&k), self.rope.as_ref(), None, offset)?;
            let q = s.temper(q, offset)?;
            let sinks = self.sinks.as_ref();
            outs.push(cache.update_and_attend(q, k, part(&v), s.scale, mask, sinks)?);
            start += len;
        }
        self.output(ops::concatenate(&outs, 2)?, gate.as_ref())
    }

    /// One decode step of a batch whose rows' caches are one padded cache per layer
    /// ([`PaddedCache`]): `x` `(B, 1, D)` projected and rotated for all rows at once (row `b`
    /// at its own position), written with one scatter, attending in one call under the step's
    /// mask. Layers with an attention temperature take [`Self::forward_rows`].
    pub fn forward_padded(
        &self,
        x: &Array,
        cache: &mut PaddedCache,
        layer: usize,
        step: &PaddedStep,
    ) -> Result<Array> {
        let s = &self.shape;
        if s.temperature.is_some() {
            return Err(mlx_rs::error::Exception::custom(
                "a layer with an attention temperature attends row by row",
            ));
        }
        let (q, k, v, gate) = self.project(x)?;
        let (q, k) = self.rotate_rows(q, k, &step.offsets)?;
        let (keys, values) = cache.update(layer, step, &k, &v)?;
        let sinks = self.sinks.as_ref();
        let out = crate::layers::sdpa::sdpa_padded(
            &q, &keys, &values, s.scale, &step.mask, &step.lens, sinks,
        )?;
        self.output(out, gate.as_ref())
    }

    /// Queries and keys of a batch, row `b` rotated at `offsets[b]` (`(B,)` int32), in one
    /// call each.
    fn rotate_rows(&self, q: Array, k: Array, offsets: &Array) -> Result<(Array, Array)> {
        match &self.rope {
            Some(rope) => Ok((
                rope.forward_rows(&q, offsets)?,
                rope.forward_rows(&k, offsets)?,
            )),
            None => Ok((q, k)),
        }
    }

    /// A KV-shared layer: its queries (RoPE at the sharing layer's offset) attend to `kv`.
    pub fn forward_shared(&self, x: &Array, mask: &Mask, kv: &SharedKv) -> Result<Array> {
        let (Qkv::QueryOnly { q_proj }, Some(QkNorm::PerHead(q_norm, None))) =
            (&self.qkv, &self.qk_norm)
        else {
            return Err(mlx_rs::error::Exception::custom(
                "only a KV-shared layer (queries only, per-head query norm) attends to shared \
                 keys and values",
            ));
        };
        let s = &self.shape;
        let q = s.split_heads_normed(&q_proj.forward(x)?, s.n_heads, Some(q_norm))?;
        let q = match &self.rope {
            Some(rope) => rope.forward(&q, kv.offset)?,
            None => q,
        };
        self.attend_to(s.temper(q, kv.offset)?, kv, mask, None)
    }

    /// Queries `(B, H, L, D)` attending to `kv` with `mask`, through the output projection.
    fn attend_to(
        &self,
        q: Array,
        kv: &SharedKv,
        mask: &Mask,
        gate: Option<&Array>,
    ) -> Result<Array> {
        let s = &self.shape;
        let (k, v) = (&kv.keys, &kv.values);
        let sinks = self.sinks.as_ref();
        let out = crate::layers::sdpa::sdpa(&q, k, v, s.scale, mask.as_sdpa(), sinks)?;
        self.output(out, gate)
    }

    /// Attention output `(B, H, L, D)`: heads merged, times the sigmoid of the output gate of a
    /// gated layer, through `o_proj`.
    fn output(&self, out: Array, gate: Option<&Array>) -> Result<Array> {
        let out = self.shape.merge_heads(out)?;
        match gate {
            Some(gate) => self.o_proj.forward(&out.multiply(ops::sigmoid(gate)?)?),
            None => self.o_proj.forward(&out),
        }
    }

    /// Queries, keys and values `(B, H, L, D)`, each normalised as the layer asks, and the
    /// output gate `(B, L, H*D)` of a gated layer.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Option<Array>)> {
        let s = &self.shape;
        let (q, k, v) = match &self.qkv {
            Qkv::Split {
                q_proj,
                k_proj,
                v_proj,
            } => (q_proj.forward(x)?, k_proj.forward(x)?, v_proj.forward(x)?),
            Qkv::Fused { qkv_proj } => {
                let qkv = qkv_proj.forward(x)?;
                // Rows are [q heads; k heads; v heads], all of one head size.
                let head_dim = qkv.dim(-1) / (s.n_heads + 2 * s.n_kv_heads);
                let (q_end, k_end) = (s.n_heads * head_dim, (s.n_heads + s.n_kv_heads) * head_dim);
                let mut parts = qkv.split_at_indices(&[q_end, k_end], -1)?.into_iter();
                let mut next = || parts.next().expect("split gives three parts");
                (next(), next(), next())
            }
            Qkv::KeyIsValue { q_proj, k_proj } => {
                let k = k_proj.forward(x)?;
                (q_proj.forward(x)?, k.clone(), k)
            }
            Qkv::QueryOnly { .. } => {
                return Err(mlx_rs::error::Exception::custom(
                    "a KV-shared layer has no keys and values of its own",
                ))
            }
        };
        let (q, gate) = match self.output_gate {
            true => {
                let (b, l) = (q.dim(0), q.dim(1));
                let mut halves = q.reshape(&[b, l, s.n_heads, -1])?.split_equal(2, -1)?;
                let gate = halves.pop().expect("two halves").reshape(&[b, l, -1])?;
                (halves.pop().expect("two halves"), Some(gate))
            }
            false => (q, None),
        };
        let (q, k) = match &self.qk_norm {
            Some(QkNorm::Whole(q_norm, k_norm)) => (q_norm.forward(&q)?, k_norm.forward(&k)?),
            _ => (q, k),
        };
        let (q_norm, k_norm) = match &self.qk_norm {
            Some(QkNorm::PerHead(q, k)) => (Some(q), k.as_ref()),
            _ => (None, None),
        };
        let q = s.split_heads_normed(&q, s.n_heads, q_norm)?;
        let k = s.split_heads_normed(&k, s.n_kv_heads, k_norm)?;
        let v = match self.v_norm_eps {
            Some(eps) => {
                let (b, l) = (v.dim(0), v.dim(1));
                let v = fast::rms_norm(v.reshape(&[b, l, s.n_kv_heads, -1])?, None, eps)?;
                v.transpose_axes(&[0, 2, 1, 3])?
            }
            None => s.split_heads(&v, s.n_kv_heads)?,
        };
        Ok((q, k, v, gate))
    }

    /// The linear layers under their checkpoint names (relative to `self_attn.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = match &mut self.qkv {
            Qkv::Split {
                q_proj,
                k_proj,
                v_proj,
            } => vec![("q_proj", q_proj), ("k_proj", k_proj), ("v_proj", v_proj)],
            Qkv::Fused { qkv_proj } => vec![("qkv_proj", qkv_proj)],
            Qkv::KeyIsValue { q_proj, k_proj } => vec![("q_proj", q_proj), ("k_proj", k_proj)],
            Qkv::QueryOnly { q_proj } => vec![("q_proj", q_proj)],
        };
        out.push(("o_proj", &mut self.o_proj));
        out
    }
}

/// Multi-head attention with grouped KV heads, RoPE and a KV cache: the part of every
/// architecture's attention after the projections.
#[derive(Debug, Clone)]
pub struct AttentionShape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub scale: f32,
    /// Sliding-window layers attend to the last `window` positions only: their cache is a
    /// [`KvCache::for_window`] ring, which also gives their masks.
    pub window: Option<i32>,
    /// Queries scaled by their position after RoPE (Ministral 3).
    pub temperature: Option<QueryTemperature>,
}

/// Llama 4's attention temperature as mlx-lm's ministral3.py applies it: after RoPE, the query
/// at position `p` is multiplied by `1 + beta * ln(1 + floor(p / max_position_embeddings))`,
/// computed in float32 and cast to the queries' dtype.
#[derive(Debug, Clone, Copy)]
pub struct QueryTemperature {
    pub beta: f32,
    pub max_position_embeddings: f32,
}

impl QueryTemperature {
    /// `q` `(B, H, L, D)` at positions `offset..offset + L`, scaled.
    pub fn apply(&self, q: &Array, offset: i32) -> Result<Array> {
        let l = q.dim(2);
        let positions = Array::arange::<f32, f32>(offset as f32, (offset + l) as f32, 1.0)?;
        let one = Array::from_f32(1.0);
        let steps = ops::floor(&positions.divide(Array::from_f32(self.max_position_embeddings))?)?;
        let scale = Array::from_f32(self.beta).multiply(one.add(&steps)?.log()?)?;
        let scale = one.add(&scale)?.reshape(&[l, 1])?.as_dtype(q.dtype())?;
        q.multiply(&scale)
    }
}

impl AttentionShape {
    /// Scores scaled by `scale_base^-0.5` (the head size, or Gemma's `query_pre_attn_scalar`),
    /// computed in f64 as Python does, then rounded once.
    pub fn new(n_heads: i32, n_kv_heads: i32, head_dim: i32, scale_base: f64) -> Self {
        Self {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: scale_base.powf(-0.5) as f32,
            window: None,
            temperature: None,
        }
    }

    /// `(B, L, H*D)` -> `(B, H, L, D)`.
    pub fn split_heads(&self, x: &Array, heads: i32) -> Result<Array> {
        self.split_heads_normed(x, heads, None)
    }

    /// `(B, L, H*D)` -> `(B, H, L, D)`, normalising each head's features on the way when a
    /// norm is given (per row, so before or after the transpose gives the same numbers).
    pub fn split_heads_normed(
        &self,
        x: &Array,
        heads: i32,
        norm: Option<&RmsNorm>,
    ) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let x = x.reshape(&[b, l, heads, -1])?;
        let x = match norm {
            Some(n) => n.forward(&x)?,
            None => x,
        };
        x.transpose_axes(&[0, 2, 1, 3])
    }

    /// RoPE on q and k at `offset` (the cache's, before this pass's update), or by `angles`
    /// when given; neither for a layer without RoPE.
    pub fn rotate(
        &self,
        q: Array,
        k: Array,
        rope: Option<&Rope>,
        angles: Option<&RotaryAngles>,
        offset: i32,
    ) -> Result<(Array, Array)> {
        match (angles, rope) {
            (Some(a), _) => Ok((a.rotate(&q)?, a.rotate(&k)?)),
            (None, Some(rope)) => Ok((rope.forward(&q, offset)?, rope.forward(&k, offset)?)),
            (None, None) => Ok((q, k)),
        }
    }

    /// The queries scaled by [`Self::temperature`], if the layer has one.
    pub fn temper(&self, q: Array, offset: i32) -> Result<Array> {
        match &self.temperature {
            Some(t) => t.apply(&q, offset),
            None => Ok(q),
        }
    }

    /// `(B, H, L, D)` -> `(B, L, H*D)`.
    pub fn merge_heads(&self, out: Array) -> Result<Array> {
        let (b, l) = (out.dim(0), out.dim(2));
        out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])
    }
}
