//! Scaled dot-product attention with its heads spread over the CPU's cores.
//!
//! On the CPU MLX's `scaled_dot_product_attention` runs unfused (a matmul, a softmax, a
//! matmul) on the caller's stream, and a CPU stream is one thread: the GEMMs use every core
//! through BLAS, the softmax over the score matrix uses one. That softmax is most of a vision
//! tower's layer (Gemma 3's SigLIP at 896 px: 2.96 s of 3.28 s for 16 x 4096 x 4096 scores on
//! this project's 2-core machine); in a text prefill it is a smaller share (SmolLM2, 3814 tokens:
//! 5% faster split, 503 tokens: unchanged). Heads are independent,
//! so [`sdpa`] cuts them into one group per core (whole groups of query heads per key-value
//! head), runs each group on its own CPU stream and concatenates the outputs. Each head runs
//! exactly the ops it runs in one call, so the result is the same bit for bit (unit test
//! below; the parity suite runs through it). A GPU, a one-query decode step, a model with one
//! key-value head and small attentions take the single call. The lanes' GEMMs may reach
//! OpenBLAS at once: its threaded level-3 driver takes one caller at a time (`level3_lock`).

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask as Mask},
    ops::{
        self,
        indexing::{Ellipsis, IndexOp},
    },
    Array, Dtype,
};

use crate::layers::{
    array::Result,
    device::{cores, in_lane, on_gpu},
};

/// Below this many scores (queries x keys x heads) one call is as fast: the split's few extra
/// ops cost more than a short softmax.
const MIN_SCORES: i64 = 1 << 18;

/// `fast::scaled_dot_product_attention` of queries `(B, Hq, L, D)` over keys and values
/// `(B, Hkv, S, D)`, with `mask` (broadcast over heads, or one per query head) and per-head
/// `sinks` `(Hq,)`: on the CPU, head groups on parallel streams.
pub(crate) fn sdpa(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<Mask<'_>>,
    sinks: Option<&Array>,
) -> Result<Array> {
    let parts = parts(q, k);
    if parts < 2 {
        return fast::scaled_dot_product_attention(q, k, v, scale, mask, sinks);
    }
    let kv_heads = k.dim(1);
    let group = q.dim(1) / kv_heads;
    let per = (kv_heads as usize).div_ceil(parts) as i32;
    let mut outs = Vec::with_capacity(parts);
    for (i, lo) in (0..kv_heads).step_by(per as usize).enumerate() {
        let hi = (lo + per).min(kv_heads);
        let heads = lo * group..hi * group;
        let (q, k, v) = (
            q.index((.., heads.clone())),
            k.index((.., lo..hi)),
            v.index((.., lo..hi)),
        );
        // A mask with a head axis of its own (`(.., Hq, L, S)`) is cut with the heads; any
        // other broadcasts over them whole.
        let own = match &mask {
            Some(Mask::Array(m)) if m.ndim() >= 3 && m.dim(-3) > 1 => Some(match m.ndim() {
                3 => m.index(heads.clone()),
                _ => m.index((.., heads.clone())),
            }),
            _ => None,
        };
        let mask = match (&own, &mask) {
            (Some(m), _) => Some(Mask::Array(m)),
            (None, Some(Mask::Array(m))) => Some(Mask::Array(m)),
            (None, Some(Mask::Causal)) => Some(Mask::Causal),
            (None, None) => None,
        };
        let sinks = sinks.map(|s| s.index(heads));
        let attend = || fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, sinks.as_ref());
        outs.push(in_lane(i, attend)?);
    }
    ops::concatenate(&outs, 1)
}

/// One decode step of a padded batch (`kv_cache/padded.rs`): queries `(B, Hq, 1, D)` over keys
/// and values `(B, Hkv, len, D)`, row `b` seeing its first `lens[b]` positions (`mask`
/// `(B, 1, 1, len)`). On a GPU one fused call. On the CPU, where MLX's attention is its unfused
/// ops, the same ops with each row's output bit for bit what that call gives the row alone
/// over its own positions: the scores row by row over the row's own positions (OpenBLAS picks
/// its kernel by a product's shape, and on AVX-512 machines its small-matrix kernels give a
/// row's dot products other bits in a wider product: docs/traps.md), padded with `finfo.min`;
/// the softmax of all rows at once (a masked position becomes `finfo.min`, exactly zero after
/// the softmax, and zeros added to a sum change nothing: so with MLX's Linux x86-64 build,
/// whose CPU softmax sums one lane; a build with wider SIMD lanes and a scalar tail would group
/// a row's sum otherwise, and the unit tests below would say so); the weighted sum of the
/// values row by row over the row's own positions, because OpenBLAS blocks a product's inner
/// axis by its length and a sum over the padded length would group the same terms otherwise.
pub(crate) fn sdpa_padded(
    q: &Array,
    keys: &Array,
    values: &Array,
    scale: f32,
    mask: &Array,
    lens: &[i32],
    sinks: Option<&Array>,
) -> Result<Array> {
    if on_gpu() {
        return fast::scaled_dot_product_attention(
            q,
            keys,
            values,
            scale,
            Mask::Array(mask),
            sinks,
        );
    }
    // MLX 0.32.2's `scaled_dot_product_attention` fallback, op for op.
    let (b, hq, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let hkv = keys.dim(1);
    let repeats = hq / hkv;
    let dtype = q.dtype();
    // MLX casts all three to their common type first; the worker's are one dtype already.
    debug_assert!(keys.dtype() == dtype && values.dtype() == dtype);
    let mut q = Array::from_f32(scale).as_dtype(dtype)?.multiply(q)?;
    let (mut k, mut v, mut mask) = (keys.clone(), values.clone(), mask.clone());
    if repeats > 1 {
        q = q.reshape(&[b, hkv, repeats, l, d])?;
        k = k.expand_dims(2)?;
        v = v.expand_dims(2)?;
        mask = mask.expand_dims(2)?;
    }
    let len = k.dim(-2);
    let lowest = Array::from_f32(lowest_of(dtype)).as_dtype(dtype)?;
    let rows = (lens.iter().enumerate())
        .map(|(r, &n)| {
            let r = r as i32;
            let own = k.index((r..r + 1, Ellipsis, ..n, ..)).swap_axes(-1, -2)?;
            let scores = ops::matmul(q.index(r..r + 1), own)?;
            if n == len {
                return Ok(scores);
            }
            let mut shape = scores.shape().to_vec();
            *shape.last_mut().unwrap() = len - n;
            ops::concatenate(&[scores, ops::broadcast_to(&lowest, &shape)?], -1)
        })
        .collect::<Result<Vec<_>>>()?;
    let scores = ops::concatenate(&rows, 0)?;
    let mut scores = ops::select(&mask, &scores, &lowest)?;
    if let Some(sinks) = sinks {
        let mut shape = scores.shape().to_vec();
        *shape.last_mut().unwrap() = 1;
        let heads: &[i32] = match repeats > 1 {
            true => &[1, hkv, repeats, 1, 1],
            false => &[1, hq, 1, 1],
        };
        let sinks = sinks.as_dtype(scores.dtype())?.reshape(heads)?;
        scores = ops::concatenate(&[ops::broadcast_to(&sinks, &shape)?, scores], -1)?;
    }
    let mut probs = ops::softmax_axis(&scores, -1, true)?;
    if sinks.is_some() {
        probs = probs.index((Ellipsis, 1..));
    }
    let rows = (lens.iter().enumerate())
        .map(|(r, &n)| {
            let r = r as i32;
            let p = probs.index((r..r + 1, Ellipsis, ..n));
            ops::matmul(&p, v.index((r..r + 1, Ellipsis, ..n, ..)))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = ops::concatenate(&rows, 0)?;
    match repeats > 1 {
        true => out.reshape(&[b, hq, l, d]),
        false => Ok(out),
    }
}

/// `mx.finfo(dtype).min`: what a boolean mask puts in place of a score it hides.
pub(crate) fn lowest_of(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// How many head groups to run at once: one per core on the CPU (at most one per key-value
/// head: a model with one, multi-query attention, takes the single call), for an attention
/// large enough.
fn parts(q: &Array, k: &Array) -> usize {
    if on_gpu() || q.ndim() != 4 || k.ndim() != 4 || k.dim(1) < 2 || q.dim(1) % k.dim(1) != 0 {
        return 1;
    }
    let scores = q.dim(1) as i64 * q.dim(2) as i64 * k.dim(2) as i64;
    if q.dim(2) < 2 || scores < MIN_SCORES {
        return 1;
    }
    cores().min(k.dim(1) as usize)
}

#[cfg(test)]
mod tests {
    use mlx_rs::random;

    use super::*;

    /// Every split the worker makes gives the single call's result bit for bit: heads and GQA
    /// groups, a batch of two, a causal prefill chunk past an offset, masks broadcast over the
    /// heads (additive `(1, 1, L, S)`, a boolean `(L, S)` window) or one per head (`(B, Hq, L,
    /// S)` and `(Hq, L, S)`), sinks.
    #[test]
    fn split_heads_equal_one_call() {
        let _mlx = fixtures::mlx_test_lock();
        let normal = |shape: &[i32], seed: u64| {
            random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
        };
        for (b, hq, hkv, l, s) in [
            (1, 16, 16, 256, 256),
            (1, 9, 3, 128, 384),
            (2, 8, 2, 200, 200),
        ] {
            let (q, k, v) = (
                normal(&[b, hq, l, 64], 1),
                normal(&[b, hkv, s, 64], 2),
                normal(&[b, hkv, s, 64], 3),
            );
            assert!(on_gpu() || cores() < 2 || parts(&q, &k) >= 2);
            let per_head = normal(&[b, hq, l, s], 4);
            let per_head_3d = normal(&[hq, l, s], 5);
            let broadcast = normal(&[1, 1, l, s], 6);
            let window = normal(&[l, s], 7).gt(Array::from_f32(-0.5)).unwrap();
            let sinks = normal(&[hq], 8);
            let masks = || -> [Option<Mask>; 6] {
                [
                    None,
                    Some(Mask::Causal),
                    Some(Mask::Array(&per_head)),
                    Some(Mask::Array(&per_head_3d)),
                    Some(Mask::Array(&broadcast)),
                    Some(Mask::Array(&window)),
                ]
            };
            for at in 0..6 {
                for sinks in [None, Some(&sinks)] {
                    let one = fast::scaled_dot_product_attention(
                        &q,
                        &k,
                        &v,
                        0.125,
                        take(masks(), at),
                        sinks,
                    )
                    .unwrap();
                    let split = sdpa(&q, &k, &v, 0.125, take(masks(), at), sinks).unwrap();
                    assert_eq!(one.shape(), split.shape());
                    assert!(
                        one.eq_values(&split).unwrap(),
                        "batch {b}, {hq}/{hkv} heads, {l}x{s}, mask {at}: the split differs"
                    );
                }
            }
        }
    }

    /// A padded decode step gives each row, on the CPU bit for bit (on a GPU to rounding), what
    /// one call gives that row alone over its own positions: query heads per key-value head 1
    /// and 3, with and without sinks, rows of 1 to 700 positions with garbage past their
    /// lengths (the rows of 370 and 520 fail with one fused call over 700: OpenBLAS blocks
    /// their weighted sums otherwise).
    #[test]
    fn padded_rows_equal_each_row_alone() {
        let _mlx = fixtures::mlx_test_lock();
        let normal = |shape: &[i32], seed: u64| {
            random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
        };
        let lens = [1, 37, 300, 370, 520, 700];
        let len = 700;
        let b = lens.len() as i32;
        let mask: Vec<bool> = (lens.iter())
            .flat_map(|&n| (0..len).map(move |j| j < n))
            .collect();
        let mask = Array::from_slice(&mask, &[b, 1, 1, len]);
        for (hq, hkv) in [(4, 4), (9, 3)] {
            let (q, k, v) = (
                normal(&[b, hq, 1, 64], 1),
                normal(&[b, hkv, len, 64], 2),
                normal(&[b, hkv, len, 64], 3),
            );
            let sinks = normal(&[hq], 4);
            for sinks in [None, Some(&sinks)] {
                let padded = sdpa_padded(&q, &k, &v, 0.125, &mask, &lens, sinks).unwrap();
                for (r, &n) in lens.iter().enumerate() {
                    let r = r as i32;
                    let row = |x: &Array| x.index((r..r + 1, .., ..n, ..));
                    let alone = fast::scaled_dot_product_attention(
                        q.index(r..r + 1),
                        row(&k),
                        row(&v),
                        0.125,
                        None,
                        sinks,
                    )
                    .unwrap();
                    let got = padded.index(r..r + 1);
                    let same = match on_gpu() {
                        false => alone.eq_values(&got).unwrap(),
                        true => alone.all_close(&got, 1e-3, 1e-3, None).unwrap(),
                    };
                    let with = sinks.is_some();
                    assert!(same, "{hq}/{hkv} heads, sinks {with}, row of {n}");
                }
            }
        }
    }

    fn take<const N: usize>(masks: [Option<Mask>; N], at: usize) -> Option<Mask> {
        masks.into_iter().nth(at).unwrap()
    }
}
