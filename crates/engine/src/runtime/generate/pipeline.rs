//! Prefill of a model split into pipeline stages: the prompt's chunks flow through the stages,
//! each stage running its chunk while the next stage runs the one before.
//!
//! Between chunks nothing is agreed by collectives: a rank's collectives and its hand-overs
//! share MLX's one ordered stream per rank and the backend's neighbour sockets, so a collective
//! between chunks would make every stage wait for the last (and a rank that ran ahead would put
//! a hidden state where its neighbour's collective reads). Instead rank 0 sends the next stage,
//! ahead of each chunk's hidden state, whether the chunk comes (no cancel asked), and each stage
//! passes that on, or a stop once its own memory is past its limit; a stopped stage takes what
//! still comes off the wire and runs nothing. The group agrees once, after the last chunk.

use mlx_rs::{transforms, Array};

use super::{context::Result, state::SequenceState};
use crate::{layers::parallel::Placement, CancelToken, EngineError};

/// Runs `chunks` (the prompt's token ids after the `done` already in the caches, but its last)
/// through this rank's stage; whether the prefill was cancelled. One agreement of the group at
/// the end: cancelled on any rank, or past its memory limit on any rank (an error).
pub(super) fn prefill(
    dec: &mut SequenceState<'_>,
    stage: &Placement,
    chunks: &[&[u32]],
    mut done: usize,
    cancel: &CancelToken,
) -> Result<bool> {
    let group = &stage.group;
    let (rank, size) = (group.rank(), group.size());
    let flag = |go: bool| Array::from_slice(&[go as i32], &[1]);
    let mut past_limit: Option<EngineError> = None;
    // Whether the next stage still waits for word of each chunk.
    let mut passing = rank + 1 < size;
    for chunk in chunks {
        let go = match rank {
            0 => !cancel.is_cancelled(),
            r => {
                let word = group.recv_like(&flag(false), r - 1)?;
                word.eval()?;
                word.as_slice::<i32>()[0] != 0
            }
        };
        let run = go && past_limit.is_none();
        if passing {
            let sent = group.send(&flag(run), rank + 1)?;
            transforms::async_eval([&sent])?;
            passing = run;
        }
        if !go || (rank == 0 && !run) {
            break;
        }
        let tokens = Array::from_slice(chunk, &[chunk.len() as i32]);
        if !run {
            dec.ctx.model.discard_stage_input(&tokens)?;
            continue;
        }
        dec.prefill_chunk(&tokens, None)?;
        group.touch();
        done += chunk.len();
        past_limit = crate::runtime::memory::check_headroom(done).err();
    }
    let cancelled = dec.ctx.cancelled(cancel)?;
    match (group.any(past_limit.is_some())?, past_limit) {
        (false, _) => Ok(cancelled),
        (true, Some(e)) => Err(e),
        (true, None) => Err(EngineError::Generation(
            "another rank of the group ran past its MLX memory limit: ask for fewer tokens or \
             split the model over more ranks"
                .into(),
        )),
    }
}
