//! One generation's constraint: which tokens may come next, and when the output is complete.

use llguidance::Matcher;

use crate::{Constraint, ConstraintError, Opening, Reasoning, Vocabulary};

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

    /// Writes into `allowed` (resized to the model's vocabulary) which tokens may come next.
    /// The end-of-sequence ids are allowed where the output may end.
    pub fn allowed(&mut self, allowed: &mut Vec<bool>) -> Result<(), ConstraintError> {
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstraintError::Stuck(e.to_string()))?;
        allowed.clear();
        allowed.resize(self.size, false);
        let mut any = false;
        mask.iter_set_entries(|id| {
            if let Some(slot) = allowed.get_mut(id) {
                *slot = true;
                any = true;
            }
        });
        if self.eos.iter().any(|&id| mask.is_allowed(id)) {
            for &id in &self.eos {
                allowed[id as usize] = true;
            }
        }
        if !any {
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
