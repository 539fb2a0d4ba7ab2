//! Prefill of a long prompt a chunk at a time between a batch's decode steps, so that the
//! generations already running keep streaming while it prefills (alone, `sequence.rs`'s `begin`
//! runs all of a prompt's chunks at once). The chunks are the ones the prompt gets alone (the same
//! boundaries, from what the prompt cache held on), so its tokens are too; the batch runs one per
//! step (`runtime/scheduler.rs`), the last chunk and the first token through [`super::resume`].

use std::time::Instant;

use mlx_rs::Array;

use super::{
    context::Result,
    sequence::{Ahead, Opened},
};
use crate::runtime::prompt::PromptInputs;

impl Opened<'_> {
    /// Whether more than one chunk of `prompt` is still to prefill before its last token
    /// (which the first step runs) and can be prefilled here: its own tokens (no images, no
    /// explicit positions), no pipeline stage, not prefilled by a joint pass.
    pub(crate) fn long(&self, prompt: &PromptInputs) -> bool {
        let ctx = &self.dec.ctx;
        self.prefilled.is_none()
            && prompt.images.is_none()
            && self.dec.positions.is_none()
            && ctx.pipeline_stage().is_none()
            && self.left(prompt) > ctx.prefill_chunk
    }

    /// Prompt positions still to prefill before the last.
    fn left(&self, prompt: &PromptInputs) -> usize {
        let done = self.reused + self.ahead.as_ref().map_or(0, |a| a.done);
        prompt.ids.len().saturating_sub(done + 1)
    }

    /// Prefills the next chunk of `prompt` (only while [`Self::long`]) into the caches.
    pub(crate) fn prefill_ahead(&mut self, prompt: &PromptInputs) -> Result<()> {
        debug_assert!(self.long(prompt));
        let ctx = self.dec.ctx.clone();
        let ahead = self.ahead.get_or_insert_with(|| Ahead {
            began: Instant::now(),
            done: 0,
        });
        let from = self.reused + ahead.done;
        let n = ctx.prefill_chunk;
        self.dec.next = from;
        let chunk = Array::from_slice(&prompt.ids[from..from + n], &[n as i32]);
        self.dec.prefill_chunk(&chunk, None)?;
        ahead.done += n;
        ctx.check_headroom(from + n)
    }
}
