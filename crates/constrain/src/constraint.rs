//! The constraints a request can put on its output, and the grammar each compiles to.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (`response_format: {"type": "json_schema"}`).
    JsonSchema(Value),
    /// Text matched by this regular expression as a whole (`regex`).
    Regex(String),
    /// Text of this Lark grammar, in llguidance's dialect (`grammar`).
    Lark(String),
}

impl Constraint {
    /// The request field the constraint came from, for errors.
    pub fn field(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "response_format",
            Constraint::JsonSchema(_) => "response_format.json_schema.schema",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "grammar",
        }
    }

    pub(crate) fn grammar(&self) -> TopLevelGrammar {
        match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({
                "type": "object"
            }))),
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`, no other whitespace), unless the
/// schema sets llguidance's own `x-guidance` options. Flexible whitespace lets a small model
/// loop on newlines until `max_new_tokens` and never close the object.
fn compact(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
    schema
}
