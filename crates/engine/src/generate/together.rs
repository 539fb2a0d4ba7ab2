//! Prefill of generations that arrive together, for a batch whose rows attend padded
//! ([`crate::BatchAttention::Padded`]): their prompts in one forward pass
//! (`LanguageModel::prefill_segments`: row-wise work over all positions, attention per
//! sequence over its own cache), where alone each prompt is a pass over the weights of its own
//! and the last token another. Like padded attention it changes the sums (a matmul over more
//! rows may add in another order: OpenBLAS does for prefill-sized row counts), so a batch
//! whose rows attend one by one, bit for bit as alone, prefills each alone.

use std::time::Instant;

use mlx_rs::{ops::indexing::IndexOp, transforms, Array};

use super::{Opened, Prefilled, Result};
use crate::{kv_cache::KvCache, prompt::PromptInputs, CancelToken};

/// Prefills each of `opened` that can (its own prompt tokens, no images, a model that runs
/// sequences together, not cancelled) in one pass, as many as fit one chunk's budget of
/// positions: a whole prompt (its last token's logits then give the first token), or the first
/// chunk of a longer one. Fewer than two: none is prefilled here.
pub(crate) fn prefill(opened: &mut [(&mut Opened<'_>, &PromptInputs, &CancelToken)]) -> Result<()> {
    let Some(((first, _, _), _)) = opened.split_first() else {
        return Ok(());
    };
    let ctx = first.dec.ctx.clone();
    if !ctx.model.rows_supported() || ctx.pipeline_stage().is_some() {
        return Ok(());
    }
    let budget = ctx.prefill_chunk;
    let mut total = 0;
    // (index, positions, whether that is the whole rest of the prompt)
    let mut chosen = Vec::new();
    for (i, (o, prompt, cancel)) in opened.iter().enumerate() {
        let rest = prompt.ids.len() - o.reused;
        // A longer prompt: its first chunk, as alone (all but the last token, in chunks).
        let (n, whole) = match rest <= budget {
            true => (rest, true),
            false => (budget, false),
        };
        let own = prompt.images.is_none() && o.dec.positions.is_none();
        if own && total + n <= budget && !cancel.is_cancelled() {
            chosen.push((i, n, whole));
            total += n;
        }
    }
    if chosen.len() < 2 {
        return Ok(());
    }
    let began = Instant::now();
    let ids: Vec<u32> = (chosen.iter())
        .flat_map(|&(i, n, _)| {
            let (o, prompt, _) = &opened[i];
            prompt.ids[o.reused..o.reused + n].iter().copied()
        })
        .collect();
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let lens: Vec<i32> = chosen.iter().map(|&(_, n, _)| n as i32).collect();
    let mut caches: Vec<&mut [KvCache]> = Vec::with_capacity(chosen.len());
    for (i, (o, _, _)) in opened.iter_mut().enumerate() {
        if chosen.iter().any(|&(c, ..)| c == i) {
            caches.push(o.dec.caches.as_mut_slice());
        }
    }
    let logits = ctx.model.prefill_segments(&tokens, &lens, &mut caches)?;
    for (s, &(i, n, whole)) in chosen.iter().enumerate() {
        let o = &mut opened[i].0;
        o.dec.quantize_caches()?;
        o.prefilled = Some(Prefilled {
            n,
            began,
            logits: whole.then(|| logits.index((.., s as i32, ..))),
        });
    }
    let arrays = (chosen.iter())
        .flat_map(|&(i, ..)| opened[i].0.dec.caches.iter().flat_map(KvCache::arrays));
    transforms::eval(arrays)?;
    mlx_rs::memory::clear_cache()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops::indexing::IndexOp, transforms, Array};

    use crate::{kv_cache::KvCache, CancelToken, Engine, LoadRequest};

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
        let dir = std::env::temp_dir().join(format!("mlx-together-{}", std::process::id()));
        fixtures::write_tiny_llama(&dir, &fixtures::TinyLlama::default()).unwrap();
        let mut engine = Engine::new();
        let req = LoadRequest {
            model: dir.display().to_string(),
            ..Default::default()
        };
        engine.load(&req, &mut |_| {}, &CancelToken::new()).unwrap();
        let model = engine.models[0].split().0.model;
        let chunk = |from: u32, n: u32| (from..from + n).collect::<Vec<u32>>();
        let [mut a1, mut b1, mut a2, mut b2] = [(); 4].map(|()| model.make_caches());
        // Rounds: (a's tokens, b's tokens), the second on top of the first.
        for (a, b) in [(chunk(3, 9), chunk(40, 5)), (chunk(20, 4), chunk(7, 11))] {
            let ids = |c: &[u32]| Array::from_slice(c, &[1, c.len() as i32]);
            let last = |x: Array| x.index((.., -1, ..));
            let alone = [
                last(model.forward(&ids(&a), &mut a1).unwrap()),
                last(model.forward(&ids(&b), &mut b1).unwrap()),
            ];
            let both = [a.clone(), b.clone()].concat();
            let lens = [a.len() as i32, b.len() as i32];
            let mut caches = [a2.as_mut_slice(), b2.as_mut_slice()];
            let logits = model
                .prefill_segments(&ids(&both), &lens, &mut caches)
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
