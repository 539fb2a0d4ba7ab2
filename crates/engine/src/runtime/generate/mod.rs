//! The generation loop: chunked, cancellable prefill, then decoding pipelined the way mlx-lm's
//! `generate_step` is (step n+1 is queued with `async_eval` before step n's token is read), with
//! streaming detokenization and stop-sequence holdback on the host; a constraint's token mask
//! (`constrain`) is applied before sampling.

mod acceptance;
mod context;
#[cfg(test)]
mod drafter_tests;
mod drafters;
mod guided;
mod interleave;
mod output;
mod padded;
mod pipeline;
mod sequence;
mod speculative;
mod state;
mod steps;
pub(crate) mod together;

pub(crate) use context::{GenerationContext, PREFILL_CHUNK_CPU, PREFILL_CHUNK_GPU};
pub(crate) use sequence::{open, resume, Opened, Sequence, Started};
pub(crate) use steps::advance;
