//! Decode steps: one forward pass for every sequence in flight ([`advance`]); the scheduler
//! (`runtime/scheduler.rs`) calls it between admissions, a lone generation being a batch of one.

use mlx_rs::{ops, Array};

use super::{context::Result, padded, sequence::Sequence, state::Next};
use crate::{
    layers::kv_cache::Caches,
    layers::kv_cache::{KvCache, PaddedCache},
    models::Input,
    runtime::prompt_cache::PromptCache,
    runtime::request::Completion,
    EngineError,
};

/// One decode step of every sequence in `seqs`: one forward pass over all of them (row by row
/// where they differ: `Caches::Rows`), then each reads its token and streams
/// it. Those that end leave `seqs` and come back with their completion (or error); their
/// caches go back to `cache`. Each sequence's tokens are those it would get alone: its own
/// sampler, constraint, stop strings and cache, and the same pipelining (its step n+1 is
/// queued before its token n is read). With `padded`, rows attend together over it where
/// they can (`generate/padded.rs`); their last bits may then differ from a lone run's.
pub(crate) fn advance(
    seqs: &mut Vec<Sequence<'_>>,
    cache: &mut PromptCache,
    mut padded: Option<&mut PaddedCache>,
) -> Vec<(usize, Result<Completion>)> {
    // Asked once per step: both uses below must see the same answer on every rank.
    let cancelled: Vec<Result<bool>> = (seqs.iter())
        .map(|s| s.dec.ctx.cancelled(&s.cancel))
        .collect();
    let go: Vec<bool> = (seqs.iter().zip(&cancelled))
        .map(|(s, c)| matches!(c, Ok(false)) && s.n < s.max_new_tokens)
        .collect();
    let mut nexts = queue_next(seqs, &go, padded.as_deref_mut());
    let mut done = Vec::new();
    let all = std::mem::take(seqs);
    for ((mut s, cancelled), next) in all.into_iter().zip(cancelled).zip(nexts.drain(..)) {
        let outcome = cancelled.and_then(|c| s.take_step(c, next));
        match outcome {
            Ok(None) => seqs.push(s),
            Ok(Some(finish)) => {
                let back = padded
                    .as_deref_mut()
                    .map_or(Ok(()), |p| padded::release(&mut s, p));
                done.push((s.id, back.and_then(|()| s.finish(finish, cache))))
            }
            Err(e) => {
                // Its row (if any) is dropped now, not kept until the next step.
                if let Some(p) = padded.as_deref_mut() {
                    let _ = padded::release(&mut s, p);
                }
                done.push((s.id, Err(e)))
            }
        }
    }
    done
}

/// Queues step n+1 of each sequence marked in `go`: their logits from one forward pass (rows
/// of a batch when there are several), then, unconstrained, the sampled token too. Constrained,
/// only the logits are: the mask needs token n, and is computed while that pass runs.
fn queue_next(
    seqs: &mut [Sequence<'_>],
    go: &[bool],
    padded: Option<&mut PaddedCache>,
) -> Vec<Option<Result<Next>>> {
    let mut nexts: Vec<Option<Result<Next>>> = go.iter().map(|_| None).collect();
    let members: Vec<usize> = (0..seqs.len()).filter(|&i| go[i]).collect();
    let rows = match padded {
        Some(p) => padded::prepare(seqs, &members, p).and_then(|on| match on {
            true => padded::logits(seqs, &members, p).map(Some),
            false => Ok(None),
        }),
        None => Ok(None),
    };
    match rows {
        Ok(Some(rows)) => {
            for (i, logits) in members.into_iter().zip(rows) {
                nexts[i] = Some(seqs[i].dec.queue(logits));
            }
        }
        Err(e) => {
            let why = match e {
                EngineError::Generation(why) => why,
                other => other.to_string(),
            };
            for i in members {
                nexts[i] = Some(Err(EngineError::Generation(why.clone())));
            }
        }
        Ok(None) if members.is_empty() => {}
        Ok(None) => queue_unpadded(seqs, &members, &mut nexts),
    }
    nexts
}

/// [`queue_next`] for `members` with their own caches: alone, or as rows attending one by one.
fn queue_unpadded(
    seqs: &mut [Sequence<'_>],
    members: &[usize],
    nexts: &mut [Option<Result<Next>>],
) {
    if let [i] = members[..] {
        let s = &mut seqs[i];
        let token = s.step.token.clone();
        let logits = s.dec.logits(&token, None);
        nexts[i] = Some(logits.and_then(|l| s.dec.queue(l)));
    } else {
        match rows_logits(seqs, members) {
            Ok(rows) => {
                for (&i, logits) in members.iter().zip(rows) {
                    nexts[i] = Some(seqs[i].dec.queue(logits));
                }
            }
            Err(e) => {
                for &i in members {
                    nexts[i] = Some(Err(EngineError::Generation(e.to_string())));
                }
            }
        }
    }
}

/// The next logits `(1, V)` of each of `members` (indices into `seqs`, same model), from one
/// forward pass over their tokens as a batch.
fn rows_logits(seqs: &mut [Sequence<'_>], members: &[usize]) -> Result<Vec<Array>> {
    let model = seqs[members[0]].dec.ctx.model;
    let mut batch: Vec<&mut Sequence<'_>> = (seqs.iter_mut().enumerate())
        .filter(|(i, _)| members.contains(i))
        .map(|(_, s)| s)
        .collect();
    let tokens: Vec<Array> = batch.iter().map(|s| s.step.token.clone()).collect();
    let ids = ops::concatenate(&tokens, 0)?.reshape(&[-1, 1])?;
    let mut caches: Vec<&mut [KvCache]> = (batch.iter_mut())
        .map(|s| s.dec.caches.as_mut_slice())
        .collect();
    let logits = model.forward(Input::tokens(&ids), Caches::Rows(&mut caches))?;
    (batch.into_iter().zip(&tokens).enumerate())
        .map(|(b, (s, token))| s.dec.row_logits(&logits, b, token))
        .collect()
}
