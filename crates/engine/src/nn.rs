//! Layers every architecture shares: linear (dense or quantized), embedding, RMS norm, RoPE,
//! attention. Each computes exactly what mlx-lm's layer of the same name computes, so that
//! greedy decoding is token-for-token equal.

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops, Array,
};

use crate::kv_cache::KvCache;

pub type Result<T> = std::result::Result<T, mlx_rs::error::Exception>;

/// Affine quantization of a weight matrix: packed weight, per-group scales and biases.
#[derive(Debug)]
pub struct Quantized {
    pub scales: Array,
    pub biases: Array,
    pub group_size: i32,
    pub bits: i32,
}

/// `y = x W^T (+ b)`, with `W` dense or affine-quantized.
#[derive(Debug)]
pub struct Linear {
    pub weight: Array,
    pub bias: Option<Array>,
    pub quantized: Option<Quantized>,
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match &self.quantized {
            Some(q) => ops::quantized_matmul(
                x,
                &self.weight,
                &q.scales,
                &q.biases,
                true,
                q.group_size,
                q.bits,
            )?,
            None => {
                if let Some(b) = &self.bias {
                    return ops::addmm(b, x, self.weight.t(), None, None);
                }
                x.matmul(self.weight.t())?
            }
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// Quantizes a dense layer in place (affine), as `load_in_4bit` asks.
    pub fn quantize(&mut self, group_size: i32, bits: i32) -> Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let (w, scales, biases) = ops::quantize(&self.weight, group_size, bits)?;
        self.weight = w;
        self.quantized = Some(Quantized {
            scales,
            biases,
            group_size,
            bits,
        });
        Ok(())
    }
}

/// Token embedding; doubles as the output head when embeddings are tied.
#[derive(Debug)]
pub struct Embedding {
    /// The table, as a linear layer of shape (vocab, hidden).
    pub table: Linear,
}

impl Embedding {
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        let rows = self.table.weight.take_axis(ids, 0)?;
        match &self.table.quantized {
            Some(q) => ops::dequantize(
                &rows,
                q.scales.take_axis(ids, 0)?,
                &q.biases.take_axis(ids, 0)?,
                q.group_size,
                q.bits,
            ),
            None => Ok(rows),
        }
    }

    /// Logits from hidden states: `h E^T`.
    pub fn as_linear(&self, h: &Array) -> Result<Array> {
        self.table.forward(h)
    }
}

/// RMS normalisation with a learned scale.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

/// Rotary position embedding over the first `dims` features of each head.
#[derive(Debug)]
pub struct Rope {
    pub dims: i32,
    pub traditional: bool,
    pub base: f32,
    pub scale: f32,
    /// Custom frequencies (Llama 3 scaling); replaces `base` when present.
    pub freqs: Option<Array>,
}

impl Rope {
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        match &self.freqs {
            Some(f) => fast::rope(x, self.dims, self.traditional, None, self.scale, offset, f),
            None => fast::rope(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                offset,
                None,
            ),
        }
    }
}

/// `silu(gate) * up`, the SwiGLU of Llama-family MLPs.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    gate.multiply(ops::sigmoid(gate)?)?.multiply(up)
}

/// Multi-head attention with grouped KV heads, RoPE and a KV cache: the part of every
/// architecture's attention after the projections.
pub struct AttentionShape {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub scale: f32,
}

impl AttentionShape {
    /// `(B, L, H*D)` -> `(B, H, L, D)`.
    pub fn split_heads(&self, x: &Array, heads: i32) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        x.reshape(&[b, l, heads, -1])?.transpose_axes(&[0, 2, 1, 3])
    }

    /// Runs RoPE on q and k at the cache's offset, appends k/v to the cache, and attends.
    /// Returns `(B, L, H*D)`.
    pub fn attend(
        &self,
        q: Array,
        k: Array,
        v: Array,
        rope: &Rope,
        cache: &mut KvCache,
    ) -> Result<Array> {
        let (b, l) = (q.dim(0), q.dim(2));
        let offset = cache.offset();
        let q = rope.forward(&q, offset)?;
        let k = rope.forward(&k, offset)?;
        let (k, v) = cache.update_and_fetch(k, v)?;
        let mask = (l > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let out = fast::scaled_dot_product_attention(q, k, v, self.scale, mask, None)?;
        out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])
    }
}
