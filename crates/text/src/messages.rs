//! Chat messages as chat templates see them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One message of a conversation: `{role, content, ...}`. Fields other than role and content
/// (`tool_calls`, `name`, `tool_call_id`, `reasoning_content`, ...) are kept in `extra` and
/// reach the template unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The content; `None` renders as `none` (assistant messages that only call tools).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Any other field of the message.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Message content: a string, or a list of parts such as `{"type": "text", "text": ".."}`
/// and `{"type": "image", ...}`, passed to the template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts (text, image, ...).
    Parts(Vec<Value>),
}

impl Message {
    /// A message with plain text content.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            extra: Map::new(),
        }
    }

    /// The text a final assistant message would be continued from: the content itself, or the
    /// last part that has a `text` field.
    pub(crate) fn continuable_text(&self) -> Option<&str> {
        match self.content.as_ref()? {
            MessageContent::Text(text) => Some(text),
            MessageContent::Parts(parts) => parts
                .iter()
                .rev()
                .find_map(|part| part.get("text")?.as_str()),
        }
    }
}

/// The seed's rule for `system_prompt`: when it is not empty, it goes in front of the
/// conversation as a system message.
pub fn prepend_system_prompt(system_prompt: &str, messages: &[Message]) -> Vec<Message> {
    let mut all = Vec::with_capacity(messages.len() + 1);
    if !system_prompt.is_empty() {
        all.push(Message::text("system", system_prompt));
    }
    all.extend_from_slice(messages);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_is_text_parts_or_null() {
        let m: Message = serde_json::from_value(json!({"role": "user", "content": "hi"})).unwrap();
        assert_eq!(m, Message::text("user", "hi"));
        let m: Message = serde_json::from_value(json!({
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]
        }))
        .unwrap();
        assert_eq!(m.continuable_text(), Some("what is this?"));
        let m: Message = serde_json::from_value(json!({
            "role": "assistant", "content": null, "tool_calls": [{"id": "1"}]
        }))
        .unwrap();
        assert_eq!(m.content, None);
        assert_eq!(m.extra["tool_calls"], json!([{"id": "1"}]));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]})
        );
    }

    #[test]
    fn a_system_prompt_is_prepended_only_when_not_empty() {
        let chat = [Message::text("user", "hi")];
        assert_eq!(prepend_system_prompt("", &chat), chat.to_vec());
        let with = prepend_system_prompt("Be brief.", &chat);
        assert_eq!(with.len(), 2);
        assert_eq!(with[0], Message::text("system", "Be brief."));
    }
}
