//! Self-attention as a layer: projections, q/k norms, RoPE, the KV cache, scaled dot-product
//! attention, the output projection.

use mlx_rs::{fast, ops, Array};

use crate::layers::{
    array::Result,
    kv_cache::{Attend, LayerKv, Positions, SharedKv},
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

/// RMS norms over the queries and keys, before RoPE (or, unscaled, after it).
#[derive(Debug)]
pub enum QkNorm {
    /// Over each head's features (Qwen3, Gemma 3); no key norm in a layer without keys of its
    /// own (Gemma 4's KV-shared layers).
    PerHead(RmsNorm, Option<RmsNorm>),
    /// Over the whole projection, all heads at once (OLMoE).
    Whole(RmsNorm, RmsNorm),
    /// Over each head's features without a learned scale, before RoPE or after it (Llama 4).
    Unscaled { eps: f32, after_rope: bool },
}

/// Which features q/k norms cover (a layer spec's choice).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QkNormOver {
    Head,
    Projection,
    /// Each head's, without a scale (no `q_norm`/`k_norm` tensors), at `eps`, before RoPE or
    /// after it.
    Unscaled {
        eps: f32,
        after_rope: bool,
    },
}

impl QkNorm {
    pub fn new(over: QkNormOver, q: RmsNorm, k: RmsNorm) -> Self {
        match over {
            QkNormOver::Head => Self::PerHead(q, Some(k)),
            QkNormOver::Projection => Self::Whole(q, k),
            QkNormOver::Unscaled { eps, after_rope } => Self::Unscaled { eps, after_rope },
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
    /// The layer's output for `x` `(B, L, D)`: queries, keys and values projected for every
    /// row at once, then rotated, stored and attended over as `kv`'s kind does it for each
    /// sequence of the pass ([`LayerKv::attend`]), then through `o_proj` together. `angles`:
    /// the pass's rotary angles when positions are given explicitly (M-RoPE), else RoPE runs at
    /// each sequence's offset. With `keep`, also the keys and values after the cache's update,
    /// for the layers that share them.
    pub fn forward(
        &self,
        x: &Array,
        kv: LayerKv,
        angles: Option<&RotaryAngles>,
        keep: bool,
    ) -> Result<(Array, Option<SharedKv>)> {
        let (q, kv_own, gate) = self.project(x)?;
        let at = At {
            rope: self.rope.as_ref(),
            angles,
            shape: &self.shape,
            norm_after: match self.qk_norm {
                Some(QkNorm::Unscaled {
                    eps,
                    after_rope: true,
                }) => Some(eps),
                _ => None,
            },
        };
        let how = Attend {
            scale: self.shape.scale,
            sinks: self.sinks.as_ref(),
            keep,
        };
        let (out, kept) = kv.attend(q, kv_own, &at, &how)?;
        Ok((self.output(out, gate.as_ref())?, kept))
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

    /// Queries, keys and values `(B, H, L, D)`, each normalised as the layer asks (no keys and
    /// values in a KV-shared layer), and the output gate `(B, L, H*D)` of a gated layer.
    fn project(&self, x: &Array) -> Result<Projected> {
        let s = &self.shape;
        if let Qkv::QueryOnly { q_proj } = &self.qkv {
            let Some(QkNorm::PerHead(q_norm, None)) = &self.qk_norm else {
                return Err(mlx_rs::error::Exception::custom(
                    "a KV-shared layer (queries only) takes a per-head query norm",
                ));
            };
            let q = s.split_heads_normed(&q_proj.forward(x)?, s.n_heads, Some(q_norm))?;
            return Ok((q, None, None));
        }
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
            Qkv::QueryOnly { .. } => unreachable!("returned above"),
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
        let (q, k) = match self.qk_norm {
            Some(QkNorm::Unscaled {
                eps,
                after_rope: false,
            }) => (
                fast::rms_norm(&q, None, eps)?,
                fast::rms_norm(&k, None, eps)?,
            ),
            _ => (q, k),
        };
        let v = match self.v_norm_eps {
            Some(eps) => {
                let (b, l) = (v.dim(0), v.dim(1));
                let v = fast::rms_norm(v.reshape(&[b, l, s.n_kv_heads, -1])?, None, eps)?;
                v.transpose_axes(&[0, 2, 1, 3])?
            }
            None => s.split_heads(&v, s.n_kv_heads)?,
        };
        Ok((q, Some((k, v)), gate))
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

/// A layer's projected queries, its keys and values (none when KV-shared), its output gate.
type Projected = (Array, Option<(Array, Array)>, Option<Array>);

/// Where one layer's queries and keys go in a pass: its RoPE at each sequence's offset, or the
/// pass's explicit angles; its query temperature.
struct At<'a> {
    rope: Option<&'a Rope>,
    angles: Option<&'a RotaryAngles>,
    shape: &'a AttentionShape,
    /// Queries and keys RMS-normed without a scale after rotating, at this epsilon (Llama 4).
    norm_after: Option<f32>,
}

impl At<'_> {
    fn norm_after(&self, x: Array) -> Result<Array> {
        match self.norm_after {
            Some(eps) => fast::rms_norm(&x, None, eps),
            None => Ok(x),
        }
    }
}

impl Positions for At<'_> {
    fn rotate(&self, x: Array, offset: i32) -> Result<Array> {
        let x = match (self.angles, self.rope) {
            (Some(a), _) => a.rotate(&x)?,
            (None, Some(rope)) => rope.forward(&x, offset)?,
            (None, None) => x,
        };
        self.norm_after(x)
    }

    fn rotate_rows(&self, x: Array, offsets: &Array) -> Result<Array> {
        let x = match self.rope {
            Some(rope) => rope.forward_rows(&x, offsets)?,
            None => x,
        };
        self.norm_after(x)
    }

    fn temper(&self, q: Array, offset: i32) -> Result<Array> {
        self.shape.temper(q, offset)
    }

    fn tempers(&self) -> bool {
        self.shape.temperature.is_some()
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
    /// [`KvCache::for_window`](crate::layers::kv_cache::KvCache::for_window) ring, which also gives
    /// their masks.
    pub window: Option<i32>,
    /// Queries scaled by their position after RoPE (Ministral 3, Llama 4's layers without
    /// RoPE).
    pub temperature: Option<QueryTemperature>,
    /// Positions attend only within their chunk of this many (Llama 4's local layers): their
    /// cache is a [`KvCache::for_chunk`](crate::layers::kv_cache::KvCache::for_chunk), which
    /// also gives their masks.
    pub chunk: Option<i32>,
}

/// Llama 4's attention temperature: after RoPE, the query at position `p` is multiplied by
/// `1 + beta * ln(1 + floor(p / max_position_embeddings))`, computed in float32, in one of
/// two forms ([`TemperatureForm`]).
#[derive(Debug, Clone, Copy)]
pub struct QueryTemperature {
    pub beta: f32,
    pub max_position_embeddings: f32,
    pub form: TemperatureForm,
}

/// How a family's mlx-lm file computes the temperature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemperatureForm {
    /// ministral3.py's: positions from 0, the scale cast to the queries' dtype, then applied.
    Mistral,
    /// llama4.py's: positions from 1, the queries times the float32 scale cast back.
    Llama4,
}

impl QueryTemperature {
    /// `q` `(B, H, L, D)` at positions `offset..offset + L`, scaled.
    pub fn apply(&self, q: &Array, offset: i32) -> Result<Array> {
        let l = q.dim(2);
        let first = match self.form {
            TemperatureForm::Mistral => offset,
            TemperatureForm::Llama4 => offset + 1,
        };
        let positions = Array::arange::<f32, f32>(first as f32, (first + l) as f32, 1.0)?;
        let one = Array::from_f32(1.0);
        let steps = ops::floor(&positions.divide(Array::from_f32(self.max_position_embeddings))?)?;
        let scale = Array::from_f32(self.beta).multiply(one.add(&steps)?.log()?)?;
        let scale = one.add(&scale)?.reshape(&[l, 1])?;
        match self.form {
            TemperatureForm::Mistral => q.multiply(&scale.as_dtype(q.dtype())?),
            TemperatureForm::Llama4 => q.multiply(&scale)?.as_dtype(q.dtype()),
        }
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
            chunk: None,
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
