//! Prefill of generations that arrive together, for a batch whose rows attend padded
//! ([`crate::BatchAttention::Padded`]): their prompts in one forward pass
//! (`Caches::Segments`: row-wise work over all positions, attention per
//! sequence over its own cache), where alone each prompt is a pass over the weights of its own
//! and the last token another. Like padded attention it changes the sums (a matmul over more
//! rows may add in another order: OpenBLAS does for prefill-sized row counts), so a batch
//! whose rows attend one by one, bit for bit as alone, prefills each alone.

use std::time::Instant;

use mlx_rs::{ops::indexing::IndexOp, transforms, Array};

use super::{context::Result, sequence::Opened, sequence::Prefilled};
use crate::{
    layers::kv_cache::Caches, layers::kv_cache::KvCache, models::Input,
    runtime::prompt::PromptInputs, CancelToken, EngineError,
};

/// Prefills the whole prompts (what the prompt cache did not hold) of those of `opened` that
/// can (their own tokens, no images, not cancelled), as many as fit one chunk's budget of
/// positions, in one pass; their last positions' logits then give their first tokens. Longer
/// prompts, `kv_bits` (alone, a prompt's last token sees its quantized chunks) and models that
/// run one sequence at a time prefill alone. Fewer than two: none is prefilled here. A failed
/// pass fails those in it (at [`super::resume`]).
pub(crate) fn prefill(opened: &mut [(&mut Opened<'_>, &PromptInputs, &CancelToken)]) {
    let Some(((first, _, _), _)) = opened.split_first() else {
        return;
    };
    let ctx = first.dec.ctx.clone();
    if !ctx.model.facts().batching.rows || ctx.pipeline_stage().is_some() || ctx.kv_bits.is_some() {
        return;
    }
    let budget = ctx.prefill_chunk;
    let mut total = 0;
    // (index, positions)
    let mut chosen = Vec::new();
    for (i, (o, prompt, cancel)) in opened.iter().enumerate() {
        let n = prompt.ids.len() - o.reused;
        let own = prompt.images.is_none() && o.dec.positions.is_none();
        if own && total + n <= budget && !cancel.is_cancelled() {
            chosen.push((i, n));
            total += n;
        }
    }
    if chosen.len() < 2 {
        return;
    }
    let began = Instant::now();
    let outcome = run(opened, &chosen).map_err(|e| match e {
        EngineError::Generation(why) => why,
        other => other.to_string(),
    });
    for (s, &(i, _)) in chosen.iter().enumerate() {
        let prefilled = match &outcome {
            Ok(logits) => Ok(Prefilled {
                began,
                logits: logits.index((.., s as i32, ..)),
            }),
            Err(why) => Err(why.clone()),
        };
        opened[i].0.prefilled = Some(prefilled);
    }
}

/// The joint pass over `chosen` (indices into `opened`, positions each), evaluated: the last
/// positions' logits `(1, S, V)`.
fn run(
    opened: &mut [(&mut Opened<'_>, &PromptInputs, &CancelToken)],
    chosen: &[(usize, usize)],
) -> Result<Array> {
    let ids: Vec<u32> = (chosen.iter())
        .flat_map(|&(i, n)| {
            let (o, prompt, _) = &opened[i];
            prompt.ids[o.reused..o.reused + n].iter().copied()
        })
        .collect();
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let lens: Vec<i32> = chosen.iter().map(|&(_, n)| n as i32).collect();
    let ctx = opened[chosen[0].0].0.dec.ctx.clone();
    let mut caches: Vec<&mut [KvCache]> = Vec::with_capacity(chosen.len());
    for (i, (o, _, _)) in opened.iter_mut().enumerate() {
        if chosen.iter().any(|&(c, _)| c == i) {
            caches.push(o.dec.caches.as_mut_slice());
        }
    }
    let logits =
        (ctx.model).forward(Input::tokens(&tokens), Caches::Segments(&mut caches, &lens))?;
    let arrays =
        (chosen.iter()).flat_map(|&(i, _)| opened[i].0.dec.caches.iter().flat_map(KvCache::arrays));
    transforms::eval(arrays)?;
    mlx_rs::memory::clear_cache()?;
    Ok(logits)
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops::indexing::IndexOp, transforms, Array};

    use crate::{
        layers::kv_cache::{Caches, KvCache},
        models::Input,
        Engine,
    };

    /// What `caches` hold, position by position (up to each cache's offset).
    fn held(caches: &[KvCache]) -> Vec<Array> {
        (caches.iter())
            .flat_map(|c| {
                let k = c.arrays().next().unwrap();
                let none = k.index((.., .., ..0, ..));
                let (k, v) = c.clone().update_and_fetch(none.clone(), none).unwrap();
                [k, v]
            })
            .collect()
    }

    fn close(x: &Array, y: &Array) -> bool {
        assert_eq!(x.shape(), y.shape());
        x.all_close(y, 1e-4, 1e-5, None).unwrap()
    }

    /// Two prompts in one pass leave each sequence's caches as its own passes do (to rounding),
    /// from empty caches and from cached prefixes of different lengths, and give each its last
    /// position's logits.
    #[test]
    fn prompts_prefilled_together_match_each_alone() {
        let _mlx = fixtures::mlx_test_lock();
        let (mut engine, dir) = Engine::with_tiny_llama("together");
        let model = engine.models[0].split().0.model;
        let chunk = |from: u32, n: u32| (from..from + n).collect::<Vec<u32>>();
        let [mut a1, mut b1, mut a2, mut b2] = [(); 4].map(|()| model.make_caches());
        // Rounds: (a's tokens, b's tokens), the second on top of the first.
        for (a, b) in [(chunk(3, 9), chunk(40, 5)), (chunk(20, 4), chunk(7, 11))] {
            let ids = |c: &[u32]| Array::from_slice(c, &[1, c.len() as i32]);
            let last = |x: Array| x.index((.., -1, ..));
            let alone = [
                last(
                    model
                        .forward(Input::tokens(&ids(&a)), Caches::One(&mut a1))
                        .unwrap(),
                ),
                last(
                    model
                        .forward(Input::tokens(&ids(&b)), Caches::One(&mut b1))
                        .unwrap(),
                ),
            ];
            let both = [a.clone(), b.clone()].concat();
            let lens = [a.len() as i32, b.len() as i32];
            let mut caches = [a2.as_mut_slice(), b2.as_mut_slice()];
            let both = ids(&both);
            let logits = model
                .forward(Input::tokens(&both), Caches::Segments(&mut caches, &lens))
                .unwrap();
            assert_eq!(logits.shape()[..2], [1, 2]);
            for (s, (one, caches)) in alone.iter().zip([(&a1, &a2), (&b1, &b2)]).enumerate() {
                let (x, y) = (held(caches.0), held(caches.1));
                transforms::eval(x.iter().chain(&y)).unwrap();
                assert!(
                    x.iter().zip(&y).all(|(x, y)| close(x, y)),
                    "sequence {s}'s caches"
                );
                assert!(
                    close(one, &logits.index((.., s as i32, ..))),
                    "sequence {s}'s logits"
                );
            }
        }
        drop(engine);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
