//! Constrained output: what a `generate` may produce, enforced token by token.
//!
//! A [`Constraint`] (a JSON schema, any JSON object, a regular expression, a Lark grammar, the
//! tool calls of a model family's [`ToolSyntax`]) is
//! compiled by llguidance against a model's [`Vocabulary`] into a [`Guide`]: before every
//! sampling step the guide says which tokens may come next (its mask, which the engine applies
//! to the logits on the device), and after it is told the sampled token it says whether the
//! output is complete. Nothing here touches MLX.

mod constraint;
mod gbnf;
mod guide;
mod harmony;
mod reasoning;
mod tools;
mod vocabulary;

pub use constraint::Constraint;
pub use guide::{Guide, TokenMask};
pub use harmony::{Harmony, Opening, Part, Splitter};
pub use reasoning::Reasoning;
pub use tools::{ToolCall, ToolSyntax};
pub use vocabulary::Vocabulary;

/// What goes wrong when constraining a generation.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The constraint does not compile (a bad schema, regex or grammar): the host's mistake,
    /// found before any compute. `field` names the request field it came from.
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// Mid-generation, no token of the model's vocabulary can continue the output (the grammar
    /// needs text this tokenizer cannot spell) or the grammar engine failed.
    #[error("the constraint cannot be continued: {0}")]
    Stuck(String),
    /// The model's tokenizer cannot be mapped to bytes for the grammar engine.
    #[error("this model's tokenizer cannot be used for constrained output: {0}")]
    Vocabulary(String),
}

#[cfg(test)]
mod tests;
