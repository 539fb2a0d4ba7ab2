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
    if !ctx.batching.rows || ctx.pipeline_stage().is_some() || ctx.kv_bits.is_some() {
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
