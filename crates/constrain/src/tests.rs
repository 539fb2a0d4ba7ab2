//! The guide on the real SmolLM2 tokenizer: masks admit exactly the texts the constraint
//! admits, token by token.

use std::collections::BTreeSet;

use serde_json::json;
use tokenizers::Tokenizer;

use crate::{Constraint, ConstraintError, Guide, Vocabulary};

/// SmolLM2's vocabulary padded as its model's logits are (49152), EOS `<|im_end|>` (2).
fn smollm2() -> Option<(Tokenizer, Vocabulary)> {
    let dir = fixtures::smollm2_dir()?;
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let vocab = Vocabulary::new(&tokenizer, &BTreeSet::from([2, 0]), 49152).unwrap();
    Some((tokenizer, vocab))
}

/// Walks `text`'s tokens through a guide: each must be allowed before it is taken. Returns
/// whether every token was allowed and the guide then allows an end-of-sequence token.
fn admits(tokenizer: &Tokenizer, vocab: &Vocabulary, constraint: &Constraint, text: &str) -> bool {
    let mut guide = Guide::new(vocab, constraint).unwrap();
    let mut allowed = Vec::new();
    for &id in tokenizer.encode(text, false).unwrap().get_ids() {
        if guide.allowed(&mut allowed).is_err() || !allowed[id as usize] {
            return false;
        }
        guide.advance(id).unwrap();
    }
    guide.is_finished() || (guide.allowed(&mut allowed).is_ok() && allowed[2] && allowed[0])
}

#[test]
fn json_schema_admits_valid_compact_json_only() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    let schema = Constraint::JsonSchema(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false
    }));
    assert!(admits(
        &tok,
        &vocab,
        &schema,
        r#"{"name": "Ada", "age": 36}"#
    ));
    assert!(
        !admits(&tok, &vocab, &schema, r#"{"name": "Ada"}"#),
        "age is required"
    );
    assert!(!admits(
        &tok,
        &vocab,
        &schema,
        r#"{"name": "Ada", "age": "36"}"#
    ));
    assert!(
        !admits(&tok, &vocab, &schema, r#"{"name":"Ada","age":36}"#),
        "compact separators are `, ` and `: `"
    );
}

#[test]
fn json_object_and_regex() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    assert!(admits(
        &tok,
        &vocab,
        &Constraint::JsonObject,
        r#"{"a": [1, 2, {"b": null}]}"#
    ));
    assert!(!admits(&tok, &vocab, &Constraint::JsonObject, "[1, 2]"));
    let date = Constraint::Regex(r"\d{4}-\d{2}-\d{2}".into());
    assert!(admits(&tok, &vocab, &date, "2026-12-03"));
    assert!(!admits(&tok, &vocab, &date, "2026-12-3"));
}

#[test]
fn lark_grammar() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    let lark = Constraint::Lark(
        "start: answer \" because \" reason\nanswer: \"yes\" | \"no\"\nreason: /[a-z ]{1,40}/\n"
            .into(),
    );
    assert!(admits(&tok, &vocab, &lark, "yes because it is warm"));
    assert!(!admits(&tok, &vocab, &lark, "maybe because"));
}

#[test]
fn a_complete_output_is_finished() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    let mut guide = Guide::new(&vocab, &Constraint::Regex("(yes|no)".into())).unwrap();
    let mut allowed = Vec::new();
    for &id in tok.encode("yes", false).unwrap().get_ids() {
        guide.allowed(&mut allowed).unwrap();
        assert!(allowed[id as usize]);
        guide.advance(id).unwrap();
    }
    assert!(
        guide.is_finished() || {
            guide.allowed(&mut allowed).unwrap();
            allowed.iter().filter(|&&a| a).count() == 2
        }
    );
}

#[test]
fn bad_constraints_name_their_field() {
    let Some((_, vocab)) = smollm2() else { return };
    let cases = [
        (
            Constraint::JsonSchema(json!({"type": "frobnicate"})),
            "response_format.json_schema.schema",
        ),
        (Constraint::Regex("(unclosed".into()), "regex"),
        (Constraint::Lark("start: missing_rule\n".into()), "grammar"),
    ];
    for (constraint, field) in cases {
        match Guide::new(&vocab, &constraint) {
            Err(ConstraintError::Invalid { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("{constraint:?}: {e}"),
            Ok(_) => panic!("{constraint:?} compiled"),
        }
    }
}
