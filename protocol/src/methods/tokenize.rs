//! `tokenize`: token ids of a text, or of a templated conversation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{default_true, ChatMessage, Method};
use crate::error::ResponseError;
use crate::params::with_defaults;

/// `tokenize`: answered at once, even during a generation.
#[derive(Debug, Clone, Copy)]
pub enum Tokenize {}

impl Method for Tokenize {
    const NAME: &'static str = "tokenize";
    type Params = TokenizeParams;
    type Result = TokenizeResult;

    fn validate(p: &TokenizeParams) -> Result<(), ResponseError> {
        match (&p.text, &p.messages) {
            (Some(_), None) => {
                let template_inputs = [
                    ("system_prompt", !p.system_prompt.is_empty()),
                    ("tools", p.tools.is_some()),
                    ("enable_thinking", p.enable_thinking.is_some()),
                    ("reasoning_effort", p.reasoning_effort.is_some()),
                    ("preserve_thinking", p.preserve_thinking.is_some()),
                ];
                match template_inputs.iter().find(|(_, given)| *given) {
                    Some((field, _)) => Err(ResponseError::invalid_params(
                        *field,
                        "`text` is tokenized as it is: template inputs go with `messages`",
                    )),
                    None => Ok(()),
                }
            }
            (None, Some(_)) => Ok(()),
            (None, None) => Err(ResponseError::invalid_params(
                "text",
                "give `text` or `messages`",
            )),
            (Some(_), Some(_)) => Err(ResponseError::invalid_params(
                "messages",
                "give `text` or `messages`, not both",
            )),
        }
    }
}

/// Params of `tokenize`: exactly one of `text` and `messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeParams {
    /// Which resident model; default the active one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Text to tokenize as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A conversation; the chat template is applied first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// With `messages`: append the assistant prompt; default true.
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// With `messages`: the template's inputs as `generate` takes them, so a count is the
    /// prompt `generate` would run. Prepended as a system message when non-empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub system_prompt: String,
    /// Passed to the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// Passed to the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
    /// Passed to the chat template; undefined when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Passed to the chat template; undefined when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_thinking: Option<bool>,
}

impl TokenizeParams {
    /// Params to tokenize `text` with the active model.
    pub fn text(text: impl Into<String>) -> Self {
        with_defaults(json!({ "text": text.into() }))
    }
}

/// Result of `tokenize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenizeResult {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Their number.
    pub count: usize,
    /// With `messages`: the templated prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}
