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
//! below; the parity suite runs through it). A GPU, a one-query decode step and small
//! attentions take the single call.

use std::cell::RefCell;

use mlx_rs::{
    error::Exception,
    fast::{self, ScaledDotProductAttentionMask as Mask},
    ops::{self, indexing::IndexOp},
    Array, Device, Stream,
};

use crate::{device::on_gpu, nn::Result};

/// Below this many scores (queries x keys x heads) one call is as fast: the split's few extra
/// ops cost more than a short softmax.
const MIN_SCORES: i64 = 1 << 18;

thread_local! {
    /// Extra CPU streams (each its own MLX thread), made on first use by the thread running MLX.
    static STREAMS: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
}

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
        let mask_part = match &mask {
            Some(Mask::Array(m)) if m.ndim() == 4 && m.dim(1) > 1 => {
                Some(m.index((.., heads.clone())))
            }
            _ => None,
        };
        let mask = match (&mask_part, &mask) {
            (Some(m), _) => Some(Mask::Array(m)),
            (None, Some(Mask::Array(m))) => Some(Mask::Array(m)),
            (None, Some(Mask::Causal)) => Some(Mask::Causal),
            (None, None) => None,
        };
        let sinks = sinks.map(|s| s.index(heads));
        let attend = || fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, sinks.as_ref());
        outs.push(in_lane(i, parts, attend)?);
    }
    ops::concatenate(&outs, 1)
}

/// Runs `f` (which queues MLX ops) on lane `i % lanes` of the CPU: lane 0 is the caller's
/// stream, each other lane a CPU stream of its own, made once per thread. On a GPU, or with
/// one core, on the caller's stream.
pub(crate) fn in_lane<T>(i: usize, lanes: usize, f: impl FnOnce() -> T) -> T {
    let lane = i % lanes.min(cores()).max(1);
    if lane == 0 || on_gpu() {
        return f();
    }
    let stream = STREAMS.with(|s| {
        let mut s = s.borrow_mut();
        while s.len() < lane {
            s.push(Stream::new_with_device(&Device::cpu()));
        }
        s[lane - 1].clone()
    });
    mlx_rs::with_stream(&stream, f)
}

/// Takes an error a lane's stream holds (see `device::synchronize`): a failure in the graph a
/// lane waited on poisons the lane too (MLX 0.32.2 passes errors along events), and the lane
/// would throw it at the next request's first split. A probe queued on each lane, waited on.
pub(crate) fn synchronize_lanes() -> std::result::Result<(), Exception> {
    let lanes = STREAMS.with(|s| s.borrow().clone());
    let mut first = Ok(());
    for lane in &lanes {
        let probe = mlx_rs::with_stream(lane, || Array::from_int(0).add(Array::from_int(0)));
        let settled = probe.and_then(|p| p.eval());
        if first.is_ok() {
            first = settled;
        }
    }
    first
}

/// The cores MLX's CPU streams can run on.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How many head groups to run at once: one per core on the CPU, for an attention large enough.
fn parts(q: &Array, k: &Array) -> usize {
    let scores = q.dim(1) as i64 * q.dim(2) as i64 * k.dim(2) as i64;
    if on_gpu() || q.dim(2) < 2 || scores < MIN_SCORES || q.dim(1) % k.dim(1) != 0 {
        return 1;
    }
    cores().min(k.dim(1) as usize)
}

#[cfg(test)]
mod tests {
    use mlx_rs::random;

    use super::*;

    fn take<const N: usize>(masks: [Option<Mask>; N], at: usize) -> Option<Mask> {
        masks.into_iter().nth(at).unwrap()
    }

    /// Every split the worker makes gives the single call's result bit for bit: heads and GQA
    /// groups, a causal prefill chunk past an offset, a per-head mask, sinks.
    #[test]
    fn split_heads_equal_one_call() {
        let normal = |shape: &[i32], seed: u64| {
            random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
        };
        for (hq, hkv, l, s) in [(16, 16, 256, 256), (9, 3, 128, 384), (8, 2, 200, 200)] {
            let (q, k, v) = (
                normal(&[1, hq, l, 64], 1),
                normal(&[1, hkv, s, 64], 2),
                normal(&[1, hkv, s, 64], 3),
            );
            assert!(parts(&q, &k) >= 2 || std::thread::available_parallelism().unwrap().get() < 2);
            let per_head = normal(&[1, hq, l, s], 4);
            let sinks = normal(&[hq], 5);
            let masks = || -> [Option<Mask>; 3] {
                [None, Some(Mask::Causal), Some(Mask::Array(&per_head))]
            };
            for at in 0..3 {
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
                        "{hq}/{hkv} heads, {l}x{s}: the split differs from one call"
                    );
                }
            }
        }
    }
}
