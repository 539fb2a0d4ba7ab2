//! One generation's constraint: which tokens may come next, and when the output is complete.

use llguidance::Matcher;

use crate::{Constraint, ConstraintError, Opening, Reasoning, Vocabulary};

/// The tokens allowed next: bit `id % 32` of word `id / 32` for each token id of the model's
/// vocabulary (llguidance's own layout). Sent to the device as it is, a thirty-second of a
/// boolean per token: on a GPU a step is short, and uploading a fresh boolean per token each
/// step cost more than the mask itself.
#[derive(Debug, Clone, Default)]
pub struct TokenMask {
    words: Vec<u32>,
    size: usize,
}

impl TokenMask {
    pub fn contains(&self, id: u32) -> bool {
        let word = self.words.get(id as usize / 32).copied().unwrap_or(0);
        (id as usize) < self.size && word >> (id % 32) & 1 == 1
    }

    /// The allowed ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.size as u32).filter(|&id| self.contains(id))
    }

    /// The bits, `size.div_ceil(32)` words.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The vocabulary size the mask covers.
    pub fn size(&self) -> usize {
        self.size
    }

    fn allow(&mut self, id: u32) {
        if let Some(word) = self
            .words
            .get_mut(id as usize / 32)
            .filter(|_| (id as usize) < self.size)
        {
            *word |= 1 << (id % 32);
        }
    }
}

/// A compiled constraint following one generation's tokens.
pub struct Guide {
    matcher: Matcher,
    /// The model's end-of-sequence ids: allowed together, when the output may end.
    eos: Vec<u32>,
    size: usize,
}

impl Guide {
    /// Compiles `constraint` for `vocab`; a constraint that does not compile is
    /// [`ConstraintError::Invalid`] naming its field. With `reasoning`, the constraint applies
    /// to what follows the model's thought.
    pub fn new(
        vocab: &Vocabulary,
        constraint: &Constraint,
        reasoning: Option<&Reasoning>,
    ) -> Result<Self, ConstraintError> {
        let opening = match reasoning {
            Some(Reasoning::Harmony(_, opening)) => *opening,
            _ => Opening::Header,
        };
        let mut grammar = constraint.grammar(vocab, opening)?;
        if let Some(reasoning) = reasoning.filter(|_| !constraint.has_own_reasoning()) {
            grammar = reasoning.wrap(grammar, &vocab.eos);
        }
        let parser =
            vocab
                .factory
                .create_parser(grammar)
                .map_err(|e| ConstraintError::Invalid {
                    field: constraint.field(),
                    reason: e.to_string(),
                })?;
        Ok(Self {
            matcher: Matcher::new(Ok(parser)),
            eos: vocab.eos.iter().copied().collect(),
            size: vocab.size,
        })
    }

    /// Writes into `mask` which tokens of the model's vocabulary may come next. The
    /// end-of-sequence ids are allowed where the output may end.
    pub fn allowed(&mut self, mask: &mut TokenMask) -> Result<(), ConstraintError> {
        let vob = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstraintError::Stuck(e.to_string()))?;
        // llguidance's own bitset, cut or padded to the model's vocabulary.
        let n = self.size.div_ceil(32);
        let words = vob.as_slice();
        mask.words.clear();
        mask.words.extend_from_slice(&words[..n.min(words.len())]);
        mask.words.resize(n, 0);
        if let Some(last) = mask
            .words
            .last_mut()
            .filter(|_| !self.size.is_multiple_of(32))
        {
            *last &= (1u32 << (self.size % 32)) - 1;
        }
        mask.size = self.size;
        if self.eos.iter().any(|&id| vob.is_allowed(id)) {
            for &id in &self.eos {
                mask.allow(id);
            }
        }
        if mask.words.iter().all(|&w| w == 0) {
            return Err(ConstraintError::Stuck(
                "no token of this model's vocabulary can continue the output".into(),
            ));
        }
        Ok(())
    }

    /// Follows the sampled `token` (not an end-of-sequence id: that ends the generation).
    pub fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Stuck(e.to_string()))
    }

    /// Forgets the last `n` tokens followed (a speculative draft's, once its masks are known).
    pub fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        self.matcher
            .rollback(n)
            .map_err(|e| ConstraintError::Stuck(e.to_string()))
    }

    /// Whether the output is complete: nothing may follow it.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
