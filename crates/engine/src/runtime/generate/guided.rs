//! A generation's constraint as the decode loop applies it: the grammar's mask of allowed
//! tokens each step, expanded on the device from its bits, and the tokens taken followed.

use std::collections::BTreeSet;

use constrain::{ConstraintError, Guide, TokenMask};
use mlx_rs::{ops, Array, Dtype};

use super::context::Result;
use crate::EngineError;

/// A generation's constraint, the buffer its masks are written to, and the device arrays that
/// expand a mask's bits.
pub(super) struct Guided {
    guide: Guide,
    field: &'static str,
    mask: TokenMask,
    /// Made at the first mask, kept for the generation.
    bits: Option<BitIndex>,
}

/// For every token id of the vocabulary, its word in a [`TokenMask`] (`id / 32`) and its bit's
/// place value in that word (`2^(id % 32)`): `words[word] / place % 2` is the bit, in three
/// elementwise kernels on the device, so only the words (a thirty-second of a boolean per
/// token) cross from the host each step.
struct BitIndex {
    word: Array,
    place: Array,
}

impl BitIndex {
    /// Computed on the device: on a GPU, an array made from host memory costs far more per
    /// byte than a kernel over it (xtask/cuda/mask_probe.py).
    fn new(size: usize) -> Result<Self> {
        let u32 = |x: i32| Array::from_int(x).as_dtype(Dtype::Uint32);
        let ids = ops::arange::<_, u32>(0, size as u32, 1)?;
        Ok(Self {
            word: ids.floor_divide(u32(32)?)?,
            place: u32(2)?.power(ids.remainder(u32(32)?)?)?,
        })
    }

    /// `mask` as a `(1, V)` boolean row.
    fn expand(&self, mask: &TokenMask) -> Result<Array> {
        let words = Array::from_slice(mask.words(), &[mask.words().len() as i32]);
        let bits = words
            .take(&self.word)?
            .floor_divide(&self.place)?
            .remainder(Array::from_int(2).as_dtype(Dtype::Uint32)?)?;
        Ok(bits.as_dtype(Dtype::Bool)?.reshape(&[1, -1])?)
    }
}

impl Guided {
    pub fn new(guide: Guide, field: &'static str) -> Self {
        Self {
            guide,
            field,
            mask: TokenMask::default(),
            bits: None,
        }
    }

    fn error(&self, e: ConstraintError) -> EngineError {
        EngineError::InvalidParams {
            field: self.field.into(),
            reason: e.to_string(),
        }
    }

    /// The tokens allowed next, as a `(1, V)` boolean row.
    pub fn mask(&mut self) -> Result<Array> {
        if let Err(e) = self.guide.allowed(&mut self.mask) {
            return Err(self.error(e));
        }
        let bits = match &mut self.bits {
            Some(bits) => bits,
            empty => empty.insert(BitIndex::new(self.mask.size())?),
        };
        bits.expand(&self.mask)
    }

    /// The masks a draft is verified with: the tokens allowed after the output so far, then
    /// after each draft token in turn. `draft` is cut before its first token the constraint
    /// refuses (sampling could not take it, nor anything after it) and after a token that ends
    /// the output (an end-of-sequence id, or one that completes it: nothing after it is taken).
    /// The guide is left where it was.
    pub fn draft_masks(&mut self, draft: &mut Vec<u32>, eos: &BTreeSet<u32>) -> Result<Vec<Array>> {
        let mut masks = vec![self.mask()?];
        let (mut keep, mut followed, mut failed) = (draft.len(), 0, None);
        for (i, &token) in draft.iter().enumerate() {
            if !self.mask.contains(token) {
                keep = i;
                break;
            }
            if eos.contains(&token) {
                keep = i + 1;
                break;
            }
            if let Err(e) = self.guide.advance(token) {
                failed = Some(self.error(e));
                keep = i;
                break;
            }
            followed += 1;
            if self.guide.is_finished() {
                keep = i + 1;
                break;
            }
            match self.mask() {
                Ok(mask) => masks.push(mask),
                // Nothing could follow this token: cut before it (one-token steps meet the same
                // state only if the model takes it, and report it then).
                Err(e) => {
                    failed = Some(e);
                    keep = i;
                    break;
                }
            }
        }
        // llguidance keeps an error of its own (a parser limit) and cannot roll back from it:
        // the request then fails with that error, though the model might not have taken the
        // token that led there.
        if let Err(e) = self.guide.rollback(followed) {
            return Err(failed.unwrap_or_else(|| self.error(e)));
        }
        draft.truncate(keep);
        Ok(masks)
    }

    /// Follows `id`; true when the output is complete.
    pub fn advance(&mut self, id: u32) -> Result<bool> {
        self.guide.advance(id).map_err(|e| self.error(e))?;
        Ok(self.guide.is_finished())
    }
}
