//! Reasoning markup (`<think>` ... `</think>`): a constraint applies to the answer after it, and
//! the thought itself is free text.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};

/// A model's reasoning markup, and whether the output starts inside it (the prompt opened it,
/// as templates with thinking on do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    pub open: String,
    pub close: String,
    pub inside: bool,
}

impl Reasoning {
    /// `content` (the constraint's grammar) after an optional thought, or after the rest of
    /// the one the prompt opened: the thought ends at the first closing tag, whitespace may
    /// follow it.
    pub(crate) fn wrap(&self, content: TopLevelGrammar) -> TopLevelGrammar {
        let mut grammars = content.grammars;
        grammars[0].name = Some("content".into());
        let close = lark_regex_literal(&self.close);
        let open = lark_string(&self.open);
        let thought = if self.inside {
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
