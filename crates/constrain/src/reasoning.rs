//! Reasoning markup (`<think>` ... `</think>`, or harmony's analysis channel): a constraint
//! applies to the answer after it, and the thought itself is free text.

use std::collections::BTreeSet;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};

use crate::{Harmony, Opening};

/// A model's reasoning markup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reasoning {
    /// Tags around the thought, and whether the output starts inside it (the prompt opened
    /// it, as templates with thinking on do).
    Tags {
        open: String,
        close: String,
        inside: bool,
    },
    /// Harmony: analysis and commentary messages, then the final one; where the prompt left
    /// the output.
    Harmony(Harmony, Opening),
}

impl Reasoning {
    /// `content` (the constraint's grammar) as the answer after the model's reasoning; `eos`
    /// the model's end-of-sequence ids.
    pub(crate) fn wrap(&self, content: TopLevelGrammar, eos: &BTreeSet<u32>) -> TopLevelGrammar {
        match self {
            Reasoning::Tags {
                open,
                close,
                inside,
            } => wrap_in_tags(content, open, close, *inside),
            Reasoning::Harmony(harmony, opening) => harmony.wrap(content, eos, *opening),
        }
    }
}

/// `content` after an optional thought, or after the rest of the one the prompt opened
/// (`inside`): the thought ends at the first closing tag, whitespace may follow it.
fn wrap_in_tags(
    content: TopLevelGrammar,
    open: &str,
    close: &str,
    inside: bool,
) -> TopLevelGrammar {
    let mut grammars = content.grammars;
    grammars[0].name = Some("content".into());
    let close = lark_regex_literal(close);
    let open = lark_string(open);
    let thought = if inside {
        "thought".to_owned()
    } else {
        format!("({open} thought)?")
    };
    let lark = format!(
        "start: {thought} body\n\
             thought[lazy]: /(.|\\n)*{close}/\n\
             body: /[ \\t\\n]*/ @content\n"
    );
    grammars.insert(0, GrammarWithLexer::from_lark(lark));
    TopLevelGrammar {
        grammars,
        max_tokens: content.max_tokens,
    }
}

/// `text` as a Lark string literal.
fn lark_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// `text` matched literally inside a Lark `/regex/`.
fn lark_regex_literal(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
