//! Tool calls: the syntax a model family writes them in (told by its chat template), the grammar
//! that makes a model write one, and the parser that reads them back from the output.

use std::collections::BTreeSet;

use serde_json::{json, Value};
use tokenizers::Tokenizer;

use crate::{Harmony, Opening};

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Hermes / Qwen: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`, one block
    /// per call.
    Hermes,
    /// Llama 3.1+: one JSON object `{"name": .., "parameters": {..}}`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`.
    Mistral,
    /// gpt-oss: a harmony message `<|channel|>commentary to=functions.NAME <|constrain|>json
    /// <|message|>{..}<|call|>` per call.
    Harmony(Harmony),
}

impl ToolSyntax {
    /// The syntax a model writes calls in: harmony when [`Harmony::detect`] finds it, else the
    /// one its chat template (`template`, the tool-use source) teaches.
    pub fn of(tokenizer: &Tokenizer, template: Option<&str>) -> Option<Self> {
        match Harmony::detect(tokenizer, template) {
            Some(harmony) => Some(ToolSyntax::Harmony(harmony)),
            None => Self::detect(template?),
        }
    }

    /// The syntax a chat template (its tool-use text) teaches, where the worker knows it.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<tool_call>") {
            Some(ToolSyntax::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolSyntax::Mistral)
        } else if template.contains("<|python_tag|>")
            || (template.contains("<|eot_id|>") && template.contains("\"parameters\""))
        {
            Some(ToolSyntax::Llama3)
        } else {
            None
        }
    }

    /// The key of a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolSyntax::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// A Lark grammar of calls of `tools` (OpenAI tool definitions; the named one only, with
    /// `only`): one, or with `parallel` one or more; `marker` is how the grammar writes
    /// Mistral's `[TOOL_CALLS]` (a special token's `<[id]>`, or the quoted text); `eos` the
    /// model's end-of-sequence ids (harmony's `<|call|>` may be one); `opening` where harmony's
    /// output starts.
    pub(crate) fn grammar(
        self,
        tools: &[Value],
        only: Option<&str>,
        parallel: bool,
        marker: &str,
        eos: &BTreeSet<u32>,
        opening: Opening,
    ) -> Result<String, String> {
        let calls: Vec<Value> = functions(tools, only)?
            .into_iter()
            .map(|(name, parameters)| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, self.arguments_key(): parameters},
                    "required": ["name", self.arguments_key()],
                    "additionalProperties": false
                })
            })
            .collect();
        let call = crate::constraint::compact(json!({"anyOf": calls}));
        // One call, or (parallel) one and then any number more.
        let more = |separator: &str, call: &str| match parallel {
            true => format!("({separator} {call})*"),
            false => String::new(),
        };
        Ok(match self {
            ToolSyntax::Hermes => format!(
                "start: call {}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {call}\n",
                more("\"\\n\"", "call")
            ),
            // Llama 3 writes one call per message.
            ToolSyntax::Llama3 => format!("start: body\nbody: %json {call}\n"),
            ToolSyntax::Mistral => format!(
                "start: {marker} \"[\" body {} \"]\"\nbody: %json {call}\n",
                more("\", \"", "body")
            ),
            // Harmony writes the name in the header and the arguments alone as the body.
            ToolSyntax::Harmony(harmony) => {
                return harmony.tool_grammar(tools, only, eos, opening)
            }
        })
    }

    /// The calls written in `text` (empty when it holds none that parse), in order.
    pub fn parse(self, text: &str) -> Vec<ToolCall> {
        let objects: Vec<Value> = match self {
            ToolSyntax::Hermes => text
                .split("<tool_call>")
                .skip(1)
                .filter_map(|rest| rest.split("</tool_call>").next())
                .filter_map(|body| serde_json::from_str(body.trim()).ok())
                .collect(),
            ToolSyntax::Llama3 => {
                let body = text.trim().trim_start_matches("<|python_tag|>");
                serde_json::from_str(body).into_iter().collect()
            }
            ToolSyntax::Mistral => {
                let body = text.trim().trim_start_matches("[TOOL_CALLS]").trim_start();
                match serde_json::from_str(body) {
                    Ok(Value::Array(calls)) => calls,
                    _ => Vec::new(),
                }
            }
            ToolSyntax::Harmony(_) => return Harmony::parse(text),
        };
        objects
            .into_iter()
            .filter_map(|call| {
                let name = call.get("name")?.as_str()?.to_owned();
                let arguments = call
                    .get(self.arguments_key())
                    .or_else(|| call.get("arguments"))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                Some(ToolCall {
                    name,
                    arguments: arguments.to_string(),
                })
            })
            .collect()
    }
}

/// The functions of `tools` (OpenAI tool definitions) a call may name (the one named `only`,
/// when given): each one's name and parameters schema.
pub(crate) fn functions(
    tools: &[Value],
    only: Option<&str>,
) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or("every tool needs `function.name`")?;
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let parameters = function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        out.push((name.to_owned(), parameters));
    }
    if out.is_empty() {
        return Err(match only {
            Some(name) => format!("no tool named {name:?} in `tools`"),
            None => "`tools` is empty".into(),
        });
    }
    Ok(out)
}

/// A call read from the output: the function's name and its arguments as JSON text (OpenAI's
/// `function.arguments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}
