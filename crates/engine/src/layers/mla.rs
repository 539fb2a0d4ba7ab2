//! Multi-head latent attention (DeepSeek-V2/V3's MLA, as mlx-lm's deepseek_v3.py computes it).
//!
//! Keys and values are not cached per head: each position caches one compressed latent
//! (`kv_lora_rank` features, normed) and one small rotary key (`qk_rope_head_dim` features,
//! shared by every head). Scores are `scale * (q_nope . k_nope + q_pe . k_pe)`, where
//! `k_nope = embed_q^T latent` and the values `unembed_out latent`; the per-head matrices
//! `embed_q` and `unembed_out` are the two halves of the checkpoint's `kv_b_proj`.
//! A decode step (one query) folds them into the query and the output instead (the
//! "absorbed" form: attention over the latents themselves); a prefill expands the latents.
//! Both are mlx-lm's, branch for branch, so tokens match it. The rotary part enters as an
//! additive mask of scores (masked positions at the dtype's lowest value).

use mlx_rs::{
    fast::ScaledDotProductAttentionMask as SdpaMask, ops, ops::indexing::IndexOp, Array, Dtype,
};

use crate::layers::{
    array::{scalar_like, Result},
    attention::QueryTemperature,
    kv_cache::{causal_mask, KvCache, Mask},
    linear::Linear,
    norm::{LayerNorm, RmsNorm},
    rope::Rope,
    sdpa::sdpa,
};

/// The sizes of a latent attention layer (config.json's names).
#[derive(Debug, Clone)]
pub struct MlaSpec {
    pub num_heads: i32,
    /// `None`: queries by one projection (`q_proj`), not through a compressed rank.
    pub q_lora_rank: Option<i32>,
    pub kv_lora_rank: i32,
    pub qk_nope_head_dim: i32,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    /// Multiplies scores (and the rotary scores); `q_head_dim^-0.5`, times YaRN's
    /// `mscale_all_dim` correction squared where the checkpoint's RoPE scaling asks.
    pub scale: f32,
    /// RoPE over the `qk_rope_head_dim` features; `None`: those features attend unrotated
    /// (Kimi Linear's MLA, which has no positional encoding).
    pub rope: Option<Rope>,
    /// The epsilon of the query and latent norms (`q_a_layernorm`, `kv_a_layernorm`).
    pub norm_eps: f32,
    /// Llama 4's query scale by position (Mistral 4), on both query parts after RoPE.
    pub temperature: Option<QueryTemperature>,
    /// How a prefill attends.
    pub prefill: LatentPrefill,
    /// DeepSeek sparse attention: each query attends only to the keys its indexer picks.
    pub indexer: Option<IndexerSpec>,
}

/// The sizes of DeepSeek-V3.2's lightning indexer (config.json's `index_*`).
#[derive(Debug, Clone)]
pub struct IndexerSpec {
    pub n_heads: i32,
    pub head_dim: i32,
    /// Keys each query keeps (`index_topk`); with no more keys than this, every key.
    pub topk: i32,
    /// RoPE over the first `qk_rope_head_dim` features of its queries and keys.
    pub rope: Rope,
}

/// DeepSeek sparse attention's indexer (`self_attn.indexer`, mlx-lm's `Indexer`): per query,
/// the `topk` keys with the highest `sum_h w_h relu(q_h . k)` among those the mask allows. Its
/// keys (one head) are cached beside the latents.
pub struct Indexer {
    pub spec: IndexerSpec,
    pub wq_b: Linear,
    pub wk: Linear,
    pub k_norm: LayerNorm,
    pub weights_proj: Linear,
}

impl Indexer {
    /// The key indices `(B, 1, L, topk)` each query keeps, or `None` when the cache (after this
    /// pass's keys) holds no more than `topk`. `qr`: the normed compressed queries; `allowed`:
    /// the pass's boolean mask, if any.
    fn select(
        &self,
        x: &Array,
        qr: &Array,
        allowed: Option<&Array>,
        cache: &mut KvCache,
    ) -> Result<Option<Array>> {
        let s = &self.spec;
        let (b, l) = (x.dim(0), x.dim(1));
        let q = self.wq_b.forward(qr)?;
        let q = q.reshape(&[b, l, s.n_heads, s.head_dim])?.swap_axes(1, 2)?;
        let k = self.k_norm.forward(&self.wk.forward(x)?)?;
        let k = k.reshape(&[b, 1, l, s.head_dim])?;
        let offset = cache.offset();
        let q = s.rope.forward(&q, offset)?;
        let k = s.rope.forward(&k, offset)?;
        // mlx-lm caches zero-wide values; the keys stand in for them here (never read).
        let (k, _) = cache.update_and_fetch(k.clone(), k)?;
        if k.dim(2) <= s.topk {
            return Ok(None);
        }
        let scores = q.matmul(k.swap_axes(-1, -2)?)?;
        let scores = ops::maximum(&scores, scalar_like(0.0, &scores)?)?;
        // `n_heads**-0.5 * head_dim**-0.5`: one Python float.
        let scale = ((s.n_heads as f64).powf(-0.5) * (s.head_dim as f64).powf(-0.5)) as f32;
        let weights = self.weights_proj.forward(x)?;
        let weights = weights.multiply(scalar_like(scale, &weights)?)?;
        let weights = weights.swap_axes(-1, -2)?.expand_dims(-1)?;
        let scores = scores.multiply(&weights)?;
        // mlx-lm 0.32.2 sums a prefill's heads one by one, in the scores' dtype (a Python
        // `sum` over head slices), a decode step's with `sum(axis=1)`.
        let scores = match l {
            1 => scores.sum_axis(1, true)?,
            _ => {
                let mut sum = scores.index((.., 0..1, .., ..));
                for h in 1..s.n_heads {
                    sum = sum.add(scores.index((.., h..h + 1, .., ..)))?;
                }
                sum
            }
        };
        let scores = match allowed {
            Some(allowed) => {
                let never = Array::from_f32(f32::NEG_INFINITY).as_dtype(scores.dtype())?;
                ops::select(allowed, &scores, &never)?
            }
            None => scores,
        };
        let part = ops::argpartition_axis(&scores, -s.topk, -1)?;
        let last = part.dim(-1) - s.topk;
        let picked = part.index((.., .., .., last..));
        Ok(Some(picked))
    }

    /// The linear layers under their checkpoint names (relative to `self_attn`).
    fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("indexer.wq_b", &mut self.wq_b),
            ("indexer.wk", &mut self.wk),
            ("indexer.weights_proj", &mut self.weights_proj),
        ]
    }
}

/// How a prefill (more than one query) attends over the expanded latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatentPrefill {
    /// The rotary scores as an additive mask beside the expanded keys (DeepSeek-V3).
    RotaryScores,
    /// Each head's key as its expanded part and the shared rotary key side by side, under the
    /// causal mask (Mistral 4).
    Concatenated,
}

/// One linear map per head: weight `(heads, out, in)`, dense or quantized (mlx-lm's
/// `MultiLinear`). Held as a [`Linear`] so quantize-on-load reaches it; never called as one.
pub struct MultiLinear {
    pub linear: Linear,
}

impl MultiLinear {
    /// `x @ W^T` (`transpose`) or `x @ W`, head by head.
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        let w = &self.linear.weight;
        match &self.linear.quantized {
            Some(q) => q.matmul(x, w, transpose),
            None if transpose => x.matmul(w.swap_axes(-1, -2)?),
            None => x.matmul(w),
        }
    }
}

/// How queries are projected.
pub enum LatentQuery {
    /// `q_proj`.
    Direct(Linear),
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))`.
    Compressed {
        q_a_proj: Linear,
        q_a_layernorm: RmsNorm,
        q_b_proj: Linear,
    },
}

/// A latent attention layer (`self_attn`).
pub struct LatentAttention {
    pub spec: MlaSpec,
    pub query: LatentQuery,
    pub kv_a_proj_with_mqa: Linear,
    pub kv_a_layernorm: RmsNorm,
    pub embed_q: MultiLinear,
    pub unembed_out: MultiLinear,
    pub o_proj: Linear,
    pub indexer: Option<Indexer>,
}

impl LatentAttention {
    /// The output `(B, L, hidden)` for one sequence's positions `x` `(B, L, hidden)`, whose
    /// cache holds the latents `(B, 1, S, kv_lora_rank)` as keys and the rotary keys
    /// `(B, 1, S, qk_rope_head_dim)` as values (with an indexer: a [`KvCache::Pair`] of that
    /// cache and the indexer's); `mask` as the cache gave it for `L` queries.
    pub fn forward(&self, x: &Array, cache: &mut KvCache, mask: &Mask) -> Result<Array> {
        let s = &self.spec;
        let (b, l) = (x.dim(0), x.dim(1));
        let (cache, index_cache) = match cache {
            KvCache::Pair(pair) => {
                let [latents, index] = &mut **pair;
                (latents, Some(index))
            }
            other => (other, None),
        };
        let (q, qr) = match &self.query {
            LatentQuery::Direct(q_proj) => (q_proj.forward(x)?, None),
            LatentQuery::Compressed {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => {
                let qr = q_a_layernorm.forward(&q_a_proj.forward(x)?)?;
                (q_b_proj.forward(&qr)?, Some(qr))
            }
        };
        let q_head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;
        let q = q
            .reshape(&[b, l, s.num_heads, q_head_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let [q_nope, q_pe] = split(&q, s.qk_nope_head_dim)?;
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let [compressed, k_pe] = split(&compressed, s.kv_lora_rank)?;
        let k_pe = k_pe
            .reshape(&[b, l, 1, s.qk_rope_head_dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let latent = self.kv_a_layernorm.forward(&compressed)?;
        let offset = cache.offset();
        let (q_pe, k_pe) = match &s.rope {
            Some(rope) => (rope.forward(&q_pe, offset)?, rope.forward(&k_pe, offset)?),
            None => (q_pe, k_pe),
        };
        let (q_nope, q_pe) = match &s.temperature {
            Some(t) => (t.apply(&q_nope, offset)?, t.apply(&q_pe, offset)?),
            None => (q_nope, q_pe),
        };
        let latent = latent.expand_dims(1)?;
        let (mut latent, mut k_pe) = cache.update_and_fetch(latent, k_pe)?;
        if l > 1 && s.prefill == LatentPrefill::Concatenated {
            let k_nope = self.embed_q.forward(&latent, false)?;
            let v = self.unembed_out.forward(&latent, true)?;
            let shape = [b, s.num_heads, k_pe.dim(2), s.qk_rope_head_dim];
            let k_pe = ops::broadcast_to(&k_pe, &shape)?;
            let q = ops::concatenate(&[q_nope, q_pe], -1)?;
            let k = ops::concatenate(&[k_nope, k_pe], -1)?;
            let out = sdpa(&q, &k, &v, s.scale, mask.as_sdpa(), None)?;
            let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
            return self.o_proj.forward(&out);
        }
        // mlx-lm asks the cache for a boolean mask (`return_array=True`): none for one query.
        let mut allowed = match mask {
            Mask::None => None,
            Mask::Causal => Some(causal_mask(l, offset, None)),
            Mask::Array(a) => Some(a.clone()),
        };
        let picked = match (&self.indexer, index_cache, &qr) {
            (Some(indexer), Some(index_cache), Some(qr)) => {
                indexer.select(x, qr, allowed.as_ref(), index_cache)?
            }
            (None, None, _) => None,
            _ => {
                return Err(mlx_rs::error::Exception::custom(
                    "an indexed latent attention needs compressed queries and a pair of caches",
                ))
            }
        };
        match picked {
            // One query: only the picked latents and rotary keys are attended.
            Some(picked) if l == 1 => {
                let idx = picked.index((.., .., 0, ..)).expand_dims(-1)?;
                let gather = |a: &Array| {
                    let shape = [idx.dim(0), idx.dim(1), idx.dim(2), a.dim(-1)];
                    a.take_along_axis(&ops::broadcast_to(&idx, &shape)?, 2)
                };
                (latent, k_pe) = (gather(&latent)?, gather(&k_pe)?);
            }
            // Several: the picked keys allowed, within what the mask allows.
            Some(picked) => {
                let mut shape = picked.shape().to_vec();
                let last = shape.len() - 1;
                shape[last] = latent.dim(2);
                let none = ops::zeros_dtype(&shape, Dtype::Bool)?;
                let sparse = none.put_along_axis(&picked, Array::from_bool(true), -1)?;
                allowed = Some(match allowed {
                    Some(a) => sparse.logical_and(&a)?,
                    None => sparse,
                });
            }
            None => {}
        }
        let pe_scores = q_pe
            .multiply(scalar_like(s.scale, &q_pe)?)?
            .matmul(k_pe.swap_axes(-1, -2)?)?;
        let pe_scores = match allowed {
            Some(allowed) => ops::select(&allowed, &pe_scores, lowest(pe_scores.dtype())?)?,
            None => pe_scores,
        };
        let scores = Some(SdpaMask::Array(&pe_scores));
        let out = if l == 1 {
            let q = self.embed_q.forward(&q_nope, true)?;
            let out = sdpa(&q, &latent, &latent, s.scale, scores, None)?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k = self.embed_q.forward(&latent, false)?;
            let v = self.unembed_out.forward(&latent, true)?;
            sdpa(&q_nope, &k, &v, s.scale, scores, None)?
        };
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out)
    }

    /// The linear layers under their checkpoint names (relative to `self_attn`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out: Vec<(&'static str, &mut Linear)> = match &mut self.query {
            LatentQuery::Direct(q_proj) => vec![("q_proj", q_proj)],
            LatentQuery::Compressed {
                q_a_proj, q_b_proj, ..
            } => vec![("q_a_proj", q_a_proj), ("q_b_proj", q_b_proj)],
        };
        out.push(("kv_a_proj_with_mqa", &mut self.kv_a_proj_with_mqa));
        out.push(("embed_q", &mut self.embed_q.linear));
        out.push(("unembed_out", &mut self.unembed_out.linear));
        out.push(("o_proj", &mut self.o_proj));
        if let Some(indexer) = &mut self.indexer {
            out.extend(indexer.linears_mut());
        }
        out
    }
}

/// `x` cut along its last axis at `at`: `mx.split(x, [at], axis=-1)`.
fn split(x: &Array, at: i32) -> Result<[Array; 2]> {
    let mut parts = x.split_at_indices(&[at], -1)?.into_iter();
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(mlx_rs::error::Exception::custom(
            "a split in two gave fewer parts",
        )),
    }
}

/// `mx.finfo(dtype).min` as an array of `dtype`.
fn lowest(dtype: Dtype) -> Result<Array> {
    let min = match dtype {
        Dtype::Float16 => -65504.0,
        // bfloat16's largest finite magnitude, exactly representable in f32.
        Dtype::Bfloat16 => -f32::from_bits(0x7F7F_0000),
        _ => f32::MIN,
    };
    Array::from_f32(min).as_dtype(dtype)
}
