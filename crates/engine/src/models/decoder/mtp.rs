//! A checkpoint's own multi-token-prediction head (Qwen3.5's and Qwen3-Next's `mtp.*`), run as
//! a drafter for speculative decoding (mlx-vlm's `qwen3_5_mtp` drafter). At position `i` it reads
//! the model's final hidden state there (after the final norm) and the embedding of token
//! `i + 1`, each RMS-normed, joined and projected back to the hidden size (`fc`); then its own
//! full-attention decoder layers (with their own KV caches) and norm; the model's head gives
//! its guess for token `i + 2`. Its own output can take the model's hidden state's place, so it
//! chains to draft several tokens. `load.rs` builds it ([`super::Decoder::with_mtp`]).

use mlx_rs::{ops, Array};

use super::{block::Block, family::Family};
use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::{Caches, KvCache},
    layers::{Linear, Result, RmsNorm},
};

pub(super) struct MtpHead {
    pub(super) fc: Linear,
    pub(super) pre_fc_norm_embedding: RmsNorm,
    pub(super) pre_fc_norm_hidden: RmsNorm,
    pub(super) layers: Vec<Block>,
    pub(super) norm: RmsNorm,
}

impl MtpHead {
    /// Refuses a head whose `fc` does not take the model's hidden state and an embedding.
    pub(super) fn check(&self) -> std::result::Result<(), EngineError> {
        let hidden = self.pre_fc_norm_hidden.weight.dim(0);
        let (fc_out, fc_in) = self.fc.dims();
        if (fc_out, fc_in) == (hidden, 2 * hidden) {
            return Ok(());
        }
        Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "mtp.fc takes {fc_in} features to {fc_out}, not twice the hidden size \
                 ({hidden}) to it: the multi-token-prediction head does not belong to this model"
            ),
        ))
    }

    pub(super) fn depth(&self) -> usize {
        self.layers.len()
    }

    pub(super) fn caches(&self) -> Vec<KvCache> {
        (0..self.depth()).map(|_| KvCache::default()).collect()
    }

    /// The head over the embedded tokens `(1, T, H)` beside the model's hidden states
    /// `(1, T, H)` before them: its normed output `(1, T, H)`, for the model's head to project.
    pub(super) fn forward(
        &self,
        family: &impl Family,
        embedded: &Array,
        hidden: &Array,
        caches: &mut [KvCache],
    ) -> Result<Array> {
        let joined = ops::concatenate(
            &[
                self.pre_fc_norm_embedding.forward(embedded)?,
                self.pre_fc_norm_hidden.forward(hidden)?,
            ],
            -1,
        )?;
        let mut h = self.fc.forward(&joined)?;
        let mut caches = Caches::One(caches);
        let masks = caches.masks(&[0], h.dim(1))?;
        for (i, layer) in self.layers.iter().enumerate() {
            let kv = caches.layer(i, 0, &masks)?;
            h = layer.forward(family, &h, kv, None)?.0;
        }
        self.norm.forward(&h)
    }
}
