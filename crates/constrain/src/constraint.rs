//! The constraints a request can put on its output, and the grammar each compiles to.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::{ConstraintError, Opening, ToolSyntax, Vocabulary};

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
    /// Text of this GBNF grammar, llama.cpp's format (`grammar` holding `::=`).
    Gbnf(String),
    /// Calls of `tools` (OpenAI definitions) in the family's `syntax`: one, or with `parallel`
    /// one or more; of the tool named `only` when given (`tool_choice: "required"` or a named
    /// function).
    ToolCalls {
        syntax: ToolSyntax,
        tools: Vec<Value>,
        only: Option<String>,
        parallel: bool,
    },
}

impl Constraint {
    /// The request field the constraint came from, for errors.
    pub fn field(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "response_format",
            Constraint::JsonSchema(_) => "response_format.json_schema.schema",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) | Constraint::Gbnf(_) => "grammar",
            Constraint::ToolCalls { .. } => "tool_choice",
        }
    }

    /// Whether the constraint's grammar lays out the whole output itself, reasoning included
    /// (harmony's tool calls): no reasoning wrap around it.
    pub(crate) fn has_own_reasoning(&self) -> bool {
        matches!(
            self,
            Constraint::ToolCalls {
                syntax: ToolSyntax::Harmony(_),
                ..
            }
        )
    }

    pub(crate) fn grammar(
        &self,
        vocab: &Vocabulary,
        opening: Opening,
    ) -> Result<TopLevelGrammar, ConstraintError> {
        Ok(match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({
                "type": "object"
            }))),
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Constraint::Gbnf(gbnf) => {
                let lark =
                    crate::gbnf::to_lark(gbnf).map_err(|reason| ConstraintError::Invalid {
                        field: self.field(),
                        reason: format!("GBNF: {reason}"),
                    })?;
                TopLevelGrammar::from_lark(lark)
            }
            Constraint::ToolCalls {
                syntax,
                tools,
                only,
                parallel,
            } => {
                let marker = match vocab.special_token("[TOOL_CALLS]") {
                    Some(id) => format!("<[{id}]>"),
                    None => "\"[TOOL_CALLS]\"".into(),
                };
                let lark = syntax
                    .grammar(
                        tools,
                        only.as_deref(),
                        *parallel,
                        &marker,
                        &vocab.eos,
                        opening,
                    )
                    .map_err(|reason| ConstraintError::Invalid {
                        field: self.field(),
                        reason,
                    })?;
                TopLevelGrammar::from_lark(lark)
            }
        })
    }
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`, no other whitespace), unless the
/// schema sets llguidance's own `x-guidance` options. Flexible whitespace lets a small model
/// loop on newlines until `max_new_tokens` and never close the object.
pub(crate) fn compact(mut schema: Value) -> Value {
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
