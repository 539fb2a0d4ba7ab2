//! Reading the JSON side files of a Hugging Face model directory: `tokenizer_config.json`,
//! `chat_template.jinja` / `chat_template.json`, `generation_config.json` and `config.json`.
//!
//! Every field is optional: models in the wild leave out almost anything, and a missing field
//! is not an error. A file that exists but is not valid JSON is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat_template::ChatTemplateSource;
use crate::tokenizer::TokenizerError;

/// What the side files of a model directory say about special tokens and the chat template.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelFiles {
    /// `bos_token` of tokenizer_config.json.
    pub bos_token: Option<String>,
    /// `eos_token` of tokenizer_config.json.
    pub eos_token: Option<String>,
    /// `pad_token` of tokenizer_config.json.
    pub pad_token: Option<String>,
    /// `unk_token` of tokenizer_config.json.
    pub unk_token: Option<String>,
    /// `add_bos_token` of tokenizer_config.json.
    pub add_bos_token: Option<bool>,
    /// The chat templates found, with the file they came from.
    pub chat_templates: Option<(NamedTemplates, ChatTemplateSource)>,
    /// `eos_token_id` of config.json and generation_config.json together.
    pub eos_token_ids: BTreeSet<u32>,
}

/// Chat templates by name. A model ships one template (named `default` here) or several
/// (`default`, `tool_use`, ...), as HF transformers allows.
pub type NamedTemplates = Vec<(String, String)>;

impl ModelFiles {
    /// Reads the side files of `dir`. The tokenizer itself (`tokenizer.json`) is not read here.
    pub fn read(dir: &Path) -> Result<Self, TokenizerError> {
        let mut files = ModelFiles::default();
        if let Some(config) = read_json(&dir.join("tokenizer_config.json"))? {
            files.bos_token = token_string(config.get("bos_token"));
            files.eos_token = token_string(config.get("eos_token"));
            files.pad_token = token_string(config.get("pad_token"));
            files.unk_token = token_string(config.get("unk_token"));
            files.add_bos_token = config.get("add_bos_token").and_then(Value::as_bool);
            if let Some(templates) = config.get("chat_template").and_then(named_templates) {
                files.chat_templates = Some((templates, ChatTemplateSource::TokenizerConfig));
            }
        }
        // As in HF transformers: a separate template file wins over tokenizer_config.json,
        // and chat_template.jinja wins over the older chat_template.json.
        if let Some(templates) = read_chat_template_json(&dir.join("chat_template.json"))? {
            files.chat_templates = Some((templates, ChatTemplateSource::ChatTemplateJson));
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| io_error(&jinja, e))?;
            files.chat_templates = Some((
                vec![("default".into(), source)],
                ChatTemplateSource::ChatTemplateJinja,
            ));
        }
        for name in ["config.json", "generation_config.json"] {
            if let Some(config) = read_json(&dir.join(name))? {
                files
                    .eos_token_ids
                    .extend(token_ids(config.get("eos_token_id")));
                // Multimodal configs keep the language model's ids one level down.
                if let Some(text) = config.get("text_config") {
                    files
                        .eos_token_ids
                        .extend(token_ids(text.get("eos_token_id")));
                }
            }
        }
        Ok(files)
    }
}

fn read_chat_template_json(path: &Path) -> Result<Option<NamedTemplates>, TokenizerError> {
    Ok(read_json(path)?.and_then(|v| v.get("chat_template").and_then(named_templates)))
}

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    crate::python_json::parse_python_json(&text)
        .map(Some)
        .map_err(|source| TokenizerError::InvalidJson {
            path: path.to_path_buf(),
            source,
        })
}

fn io_error(path: &Path, source: std::io::Error) -> TokenizerError {
    TokenizerError::Io {
        path: PathBuf::from(path),
        source,
    }
}

/// A special token is written either as a plain string or as an AddedToken object
/// (`{"content": "<s>", "lstrip": false, ...}`).
fn token_string(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `eos_token_id` is an int or a list of ints.
fn token_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// `chat_template` is a string or a list of `{name, template}`.
fn named_templates(value: &Value) -> Option<NamedTemplates> {
    match value {
        Value::String(s) => Some(vec![("default".into(), s.clone())]),
        Value::Array(items) => {
            let templates: NamedTemplates = items
                .iter()
                .filter_map(|item| {
                    let name = item.get("name")?.as_str()?;
                    let template = item.get("template")?.as_str()?;
                    Some((name.to_owned(), template.to_owned()))
                })
                .collect();
            (!templates.is_empty()).then_some(templates)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn special_tokens_are_strings_or_objects() {
        assert_eq!(token_string(Some(&json!("<s>"))), Some("<s>".into()));
        assert_eq!(
            token_string(Some(&json!({"content": "</s>", "lstrip": false}))),
            Some("</s>".into())
        );
        assert_eq!(token_string(Some(&Value::Null)), None);
    }

    #[test]
    fn eos_ids_are_an_int_or_a_list() {
        assert_eq!(token_ids(Some(&json!(2))), vec![2]);
        assert_eq!(token_ids(Some(&json!([1, 106]))), vec![1, 106]);
        assert!(token_ids(None).is_empty());
    }

    #[test]
    fn chat_template_is_a_string_or_a_named_list() {
        assert_eq!(
            named_templates(&json!("{{ x }}")),
            Some(vec![("default".into(), "{{ x }}".into())])
        );
        let list =
            json!([{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]);
        assert_eq!(
            named_templates(&list),
            Some(vec![
                ("default".into(), "a".into()),
                ("tool_use".into(), "b".into())
            ])
        );
        assert_eq!(named_templates(&json!([])), None);
    }
}
