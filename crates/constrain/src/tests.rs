//! The guide on the real SmolLM2 tokenizer: masks admit exactly the texts the constraint
//! admits, token by token.

use std::collections::BTreeSet;

use serde_json::json;
use tokenizers::Tokenizer;

use crate::{Constraint, ConstraintError, Guide, TokenMask, Vocabulary};

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
    admits_after(tokenizer, vocab, constraint, None, text)
}

pub(crate) fn admits_after(
    tokenizer: &Tokenizer,
    vocab: &Vocabulary,
    constraint: &Constraint,
    reasoning: Option<&crate::Reasoning>,
    text: &str,
) -> bool {
    let mut guide = Guide::new(vocab, constraint, reasoning).unwrap();
    let mut allowed = TokenMask::default();
    for &id in tokenizer.encode(text, false).unwrap().get_ids() {
        if guide.allowed(&mut allowed).is_err() || !allowed.contains(id) {
            return false;
        }
        guide.advance(id).unwrap();
    }
    guide.is_finished()
        || (guide.allowed(&mut allowed).is_ok() && allowed.contains(2) && allowed.contains(0))
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
    let mut guide = Guide::new(&vocab, &Constraint::Regex("(yes|no)".into()), None).unwrap();
    let mut allowed = TokenMask::default();
    for &id in tok.encode("yes", false).unwrap().get_ids() {
        guide.allowed(&mut allowed).unwrap();
        assert!(allowed.contains(id));
        guide.advance(id).unwrap();
    }
    assert!(
        guide.is_finished() || {
            guide.allowed(&mut allowed).unwrap();
            allowed.ids().count() == 2
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
        match Guide::new(&vocab, &constraint, None) {
            Err(ConstraintError::Invalid { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("{constraint:?}: {e}"),
            Ok(_) => panic!("{constraint:?} compiled"),
        }
    }
}

pub(crate) fn weather_tool() -> serde_json::Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": false}}})
}

#[test]
fn tool_call_grammars_admit_their_familys_syntax() {
    use crate::ToolSyntax;
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    let cases = [
        (ToolSyntax::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        (ToolSyntax::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
        (ToolSyntax::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"),
    ];
    for (syntax, text) in cases {
        let constraint = Constraint::ToolCalls {
            syntax,
            tools: vec![weather_tool()],
            only: None,
            parallel: true,
        };
        assert!(admits(&tok, &vocab, &constraint, text), "{syntax:?} {text}");
        let wrong = text.replace("\"city\"", "\"town\"");
        assert!(
            !admits(&tok, &vocab, &constraint, &wrong),
            "{syntax:?} {wrong}"
        );
        let calls = syntax.parse(text);
        assert_eq!(calls.len(), 1, "{syntax:?}");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
    }
    let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    let two = format!("{one}\n{one}");
    for (parallel, admits_two) in [(true, true), (false, false)] {
        let constraint = Constraint::ToolCalls {
            syntax: ToolSyntax::Hermes,
            tools: vec![weather_tool()],
            only: Some("get_weather".into()),
            parallel,
        };
        assert!(admits(&tok, &vocab, &constraint, one));
        assert_eq!(
            admits(&tok, &vocab, &constraint, &two),
            admits_two,
            "parallel {parallel}"
        );
    }
    let only_missing = Constraint::ToolCalls {
        syntax: ToolSyntax::Hermes,
        tools: vec![weather_tool()],
        only: Some("send_mail".into()),
        parallel: false,
    };
    assert!(matches!(
        Guide::new(&vocab, &only_missing, None),
        Err(ConstraintError::Invalid {
            field: "tool_choice",
            ..
        })
    ));
}

#[test]
fn tool_syntax_is_read_from_the_template() {
    use crate::ToolSyntax;
    assert_eq!(
        ToolSyntax::detect("{{ '<tool_call>' }}"),
        Some(ToolSyntax::Hermes)
    );
    assert_eq!(
        ToolSyntax::detect("[TOOL_CALLS]"),
        Some(ToolSyntax::Mistral)
    );
    assert_eq!(
        ToolSyntax::detect("<|python_tag|>"),
        Some(ToolSyntax::Llama3)
    );
    assert_eq!(ToolSyntax::detect("{{ messages }}"), None);
    // Text around and between calls; a call that does not parse is left out.
    let text = "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>";
    let calls = ToolSyntax::Hermes.parse(text);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("a", "{}")
    );
}

#[test]
fn a_constraint_applies_after_the_thought() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    let json = Constraint::JsonSchema(
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    );
    let optional = crate::Reasoning::Tags {
        open: "<think>".into(),
        close: "</think>".into(),
        inside: false,
    };
    let thought = "<think>Hmm, {not json} yet.</think>\n\n{\"a\": 1}";
    assert!(admits_after(&tok, &vocab, &json, Some(&optional), thought));
    assert!(
        admits_after(&tok, &vocab, &json, Some(&optional), "{\"a\": 1}"),
        "thinking is optional"
    );
    assert!(!admits_after(
        &tok,
        &vocab,
        &json,
        Some(&optional),
        "<think>x</think> nope"
    ));
    let inside = crate::Reasoning::Tags {
        open: "<think>".into(),
        close: "</think>".into(),
        inside: true,
    };
    assert!(admits_after(
        &tok,
        &vocab,
        &json,
        Some(&inside),
        "so a is 1.</think>{\"a\": 1}"
    ));
    assert!(
        !admits_after(&tok, &vocab, &json, Some(&inside), "{\"a\": 1}"),
        "the open thought must close first"
    );
}

#[test]
fn gbnf_grammars_as_llama_cpp_writes_them() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    // llama.cpp's style: multi-line rules, character classes, `-` in names, escapes, comments.
    let gbnf = Constraint::Gbnf(
        r#"
# a list of one to three lowercase items
root ::= "items:" item-list "\n"
item-list ::=
    item
    ("," item){0,2}
item ::= " " [a-z]+ ( "!" | "?" )?
"#
        .into(),
    );
    assert!(admits(&tok, &vocab, &gbnf, "items: tea, milk!\n"));
    assert!(
        !admits(&tok, &vocab, &gbnf, "items: tea, milk, eggs, rice\n"),
        "at most three"
    );
    assert!(!admits(&tok, &vocab, &gbnf, "items: Tea\n"));
    let (field, reason) = refusal(&vocab, "item ::= \"x\"\n");
    assert_eq!(field, "grammar");
    assert!(reason.contains("root"), "{reason}");
    // Found by `fuzz/constraint`: a `::=` after something other than a rule name panicked.
    let (field, reason) = refusal(&vocab, "root ::= \"a\" [a-z] ::= \"b\"");
    assert_eq!(field, "grammar");
    assert!(reason.contains("must follow a rule name"), "{reason}");
}

/// The field and reason a GBNF grammar that must not compile is refused with.
fn refusal(vocab: &Vocabulary, gbnf: &str) -> (&'static str, String) {
    match Guide::new(vocab, &Constraint::Gbnf(gbnf.into()), None) {
        Err(ConstraintError::Invalid { field, reason }) => (field, reason),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("{gbnf:?} compiled"),
    }
}
