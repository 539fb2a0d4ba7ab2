//! Chat templates: Jinja templates rendered with the semantics of HF transformers'
//! `apply_chat_template` (minijinja underneath).

use std::collections::BTreeMap;

use minijinja::{Environment, Value};
use serde::Serialize;
use serde_json::Map;

use crate::messages::Message;
use crate::template_functions::{self, RaisedException};

/// Where a model's chat template came from (the `load` result's `chat_template.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ChatTemplateSource {
    /// `chat_template` of tokenizer_config.json.
    #[serde(rename = "tokenizer_config")]
    TokenizerConfig,
    /// A `chat_template.jinja` file.
    #[serde(rename = "chat_template.jinja")]
    ChatTemplateJinja,
    /// A `chat_template.json` file (the older place for a separate template).
    #[serde(rename = "chat_template.json")]
    ChatTemplateJson,
    /// `tokenizer.chat_template` of a GGUF file.
    #[serde(rename = "gguf")]
    Gguf,
    /// `chat_template_override` of the load request.
    #[serde(rename = "override")]
    Override,
    /// The model has no chat template.
    #[serde(rename = "none")]
    None,
}

impl ChatTemplateSource {
    /// The protocol's name for this source.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TokenizerConfig => "tokenizer_config",
            Self::ChatTemplateJinja => "chat_template.jinja",
            Self::ChatTemplateJson => "chat_template.json",
            Self::Gguf => "gguf",
            Self::Override => "override",
            Self::None => "none",
        }
    }
}

/// Failures of compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template does not compile.
    #[error("the chat template `{name}` is not valid Jinja: {source}; fix it or pass chat_template_override")]
    Syntax {
        /// The template's name (`default`, `tool_use`, ...).
        name: String,
        /// minijinja's description, with the line.
        source: minijinja::Error,
    },
    /// The template called `raise_exception(message)`: it refuses these messages.
    #[error("the chat template rejected the messages: {0}")]
    Raised(String),
    /// Rendering ran out of fuel: the template loops (nearly) without end.
    #[error("the chat template ran more than {TEMPLATE_FUEL} instructions without finishing (does it loop without end?); fix it or pass chat_template_override")]
    TooLong,
    /// Rendering failed for another reason (an unsupported filter, a type error, recursion
    /// deeper than minijinja's limit, ...).
    #[error("rendering the chat template failed: {0:#}")]
    Render(minijinja::Error),
    /// `continue_final_message` was asked for but cannot be honoured.
    #[error("continue_final_message: {0}")]
    ContinueFinalMessage(&'static str),
}

/// The special tokens a template may print (`bos_token`, `eos_token`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token text.
    pub bos_token: Option<String>,
    /// End-of-sequence token text.
    pub eos_token: Option<String>,
    /// Padding token text.
    pub pad_token: Option<String>,
    /// Unknown token text.
    pub unk_token: Option<String>,
}

/// The knobs of one render, besides the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// End the prompt with the header of an assistant turn (default true).
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open so that generation continues it. Implies
    /// `add_generation_prompt = false` (HF transformers refuses both; we let this one win).
    pub continue_final_message: bool,
    /// `enable_thinking` for templates that have a thinking switch; undefined when `None`.
    pub enable_thinking: Option<bool>,
    /// Tool (function) definitions; `none` in the template when `None`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Any other template variable (`documents`, `reasoning_effort`, ...).
    pub extra: Map<String, serde_json::Value>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            continue_final_message: false,
            enable_thinking: None,
            tools: None,
            extra: Map::new(),
        }
    }
}

/// A compiled chat template (one or several named ones) with the model's special tokens.
/// `Send + Sync`: render from any thread.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    names: Vec<String>,
    /// The raw text of each template, in the order of `names`.
    sources: Vec<String>,
    special: SpecialTokens,
}

const DEFAULT_NAME: &str = "default";
const TOOL_USE_NAME: &str = "tool_use";

impl ChatTemplate {
    /// Compiles one template.
    pub fn new(source: &str, special: SpecialTokens) -> Result<Self, ChatTemplateError> {
        Self::with_names(vec![(DEFAULT_NAME.into(), source.into())], special)
    }

    /// Compiles named templates (`default`, `tool_use`, ...), as a tokenizer_config.json with a
    /// list of templates holds. `tool_use` is used when tools are given, `default` otherwise,
    /// and the first one when neither name exists.
    pub fn with_names(
        templates: Vec<(String, String)>,
        special: SpecialTokens,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = hf_environment();
        let mut names = Vec::with_capacity(templates.len());
        let mut sources = Vec::with_capacity(templates.len());
        for (name, source) in templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(&source))
                .map_err(|source| ChatTemplateError::Syntax {
                    name: name.clone(),
                    source,
                })?;
            names.push(name);
            sources.push(source);
        }
        Ok(ChatTemplate {
            env,
            names,
            sources,
            special,
        })
    }

    /// The raw Jinja text of the template used without tools (the `load` result's
    /// `chat_template.text`).
    pub fn source(&self) -> &str {
        self.source_picked(false)
    }

    /// The raw Jinja text of the template used with tools (`tool_use` where there is one).
    pub fn tools_source(&self) -> &str {
        self.source_picked(true)
    }

    fn source_picked(&self, has_tools: bool) -> &str {
        let name = self.pick(has_tools);
        let i = self.names.iter().position(|n| n == name).unwrap_or(0);
        &self.sources[i]
    }

    /// The special tokens the template sees.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Renders `messages` into a prompt string, as `apply_chat_template(tokenize=False)` does.
    pub fn render(
        &self,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let add_generation_prompt =
            options.add_generation_prompt && !options.continue_final_message;
        let name = self.pick(options.tools.is_some());
        let template = self
            .env
            .get_template(name)
            .map_err(ChatTemplateError::Render)?;

        let mut context: BTreeMap<String, Value> = BTreeMap::new();
        let special = [
            ("bos_token", &self.special.bos_token),
            ("eos_token", &self.special.eos_token),
            ("pad_token", &self.special.pad_token),
            ("unk_token", &self.special.unk_token),
        ];
        for (key, token) in special {
            if let Some(token) = token {
                context.insert(key.into(), Value::from(token.as_str()));
            }
        }
        context.insert("documents".into(), Value::from(()));
        for (key, value) in &options.extra {
            context.insert(key.clone(), Value::from_serialize(value));
        }
        if let Some(enable_thinking) = options.enable_thinking {
            context.insert("enable_thinking".into(), Value::from(enable_thinking));
        }
        context.insert("messages".into(), Value::from_serialize(messages));
        context.insert(
            "tools".into(),
            Value::from_serialize(options.tools.as_ref()),
        );
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );

        let rendered = template.render(context).map_err(render_error)?;
        if options.continue_final_message {
            let last = messages
                .last()
                .ok_or(ChatTemplateError::ContinueFinalMessage(
                    "there are no messages",
                ))?;
            let text = last
                .continuable_text()
                .ok_or(ChatTemplateError::ContinueFinalMessage(
                    "the final message has no text to continue",
                ))?;
            return cut_after_final_message(rendered, text);
        }
        Ok(rendered)
    }

    fn pick(&self, has_tools: bool) -> &str {
        let has = |name: &str| self.names.iter().any(|n| n == name);
        if has_tools && has(TOOL_USE_NAME) {
            TOOL_USE_NAME
        } else if has(DEFAULT_NAME) {
            DEFAULT_NAME
        } else {
            &self.names[0]
        }
    }
}

/// The most instructions one rendering may run (minijinja's fuel): a template that loops
/// without end fails the request instead of holding the worker.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// The environment HF transformers renders chat templates in.
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_fuel(Some(TEMPLATE_FUEL));
    // Python's jinja2 default: no autoescaping, whatever the template's name.
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_function("raise_exception", template_functions::raise_exception);
    env.add_function("strftime_now", template_functions::strftime_now);
    env.add_filter("tojson", template_functions::tojson);
    env
}

fn render_error(error: minijinja::Error) -> ChatTemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return ChatTemplateError::Raised(raised.0.clone());
        }
        source = e.source();
    }
    match error.kind() {
        minijinja::ErrorKind::OutOfFuel => ChatTemplateError::TooLong,
        _ => ChatTemplateError::Render(error),
    }
}

/// HF's `{% generation %}...{% endgeneration %}` marks assistant text for training masks and
/// renders its body unchanged. minijinja has no such tag; an always-true `if` block renders
/// the same, whitespace control included.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` after the opening `{%` (in `{%}` they would overlap).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            break;
        };
        let inner = &tag[2..end];
        let (open_ws, body) = split_ws_marker_front(inner);
        let (body, close_ws) = split_ws_marker_back(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open_ws} {r} {close_ws}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ws_marker_front(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => s.split_at(c.len_utf8()),
        _ => ("", s),
    }
}

fn split_ws_marker_back(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-' | '+') => s.split_at(s.len() - 1),
        _ => (s, ""),
    }
}

/// `continue_final_message`: cut the rendered prompt right after the final message's text,
/// dropping the end-of-turn tokens the template wrote after it (HF transformers' rule).
fn cut_after_final_message(rendered: String, text: &str) -> Result<String, ChatTemplateError> {
    let stripped = text.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(ChatTemplateError::ContinueFinalMessage(
            "the final message does not appear in the rendered prompt; the template changes it",
        ));
    };
    let lstripped = text.trim_start();
    let end = if rendered[at..].starts_with(lstripped) {
        // The template kept the message's trailing whitespace.
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[Message]) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(source, SpecialTokens::default())?
            .render(messages, &RenderOptions::default())
    }

    #[test]
    fn raise_exception_becomes_a_clear_error() {
        let err = render(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}",
            &[Message::text("assistant", "hi")],
        )
        .unwrap_err();
        match &err {
            ChatTemplateError::Raised(message) => {
                assert_eq!(message, "Conversation must start with user")
            }
            other => panic!("expected Raised, got {other:?}"),
        }
        assert!(err
            .to_string()
            .contains("Conversation must start with user"));
    }

    #[test]
    fn overlapping_tag_marks_are_a_syntax_error_not_a_panic() {
        // Found by `fuzz/chat_template`.
        for source in ["-{%}", "{%}", "{%-}%}"] {
            let err = ChatTemplate::new(source, SpecialTokens::default()).err();
            assert!(
                matches!(err, Some(ChatTemplateError::Syntax { .. })),
                "{source}: {err:?}"
            );
        }
    }

    #[test]
    fn a_template_that_loops_without_end_runs_out_of_fuel() {
        let endless =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = render(endless, &[Message::text("user", "hi")]).unwrap_err();
        assert!(matches!(err, ChatTemplateError::TooLong), "{err:?}");
        assert!(err.to_string().contains("chat_template_override"), "{err}");
    }

    #[test]
    fn endless_recursion_and_huge_repeats_fail_cleanly() {
        let recursive = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let err = render(recursive, &[Message::text("user", "hi")]).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
        let huge = "{{ 'x' * 2000000000 }}";
        let err = render(huge, &[Message::text("user", "hi")]).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn source_is_the_raw_text_used_without_tools() {
        let named = |names: &[&str]| {
            let templates = names
                .iter()
                .map(|n| (n.to_string(), format!("[{n}]")))
                .collect();
            ChatTemplate::with_names(templates, SpecialTokens::default()).unwrap()
        };
        assert_eq!(named(&["tool_use", "default"]).source(), "[default]");
        assert_eq!(named(&["tool_use", "rag"]).source(), "[tool_use]");
        let generation = "{% generation %}x{% endgeneration %}";
        let template = ChatTemplate::new(generation, SpecialTokens::default()).unwrap();
        assert_eq!(
            template.source(),
            generation,
            "as written, not as rewritten"
        );
    }

    #[test]
    fn generation_tags_render_their_body() {
        let source = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration %}\n{% endfor %}";
        let out = render(
            source,
            &[
                Message::text("assistant", "a"),
                Message::text("assistant", "b"),
            ],
        )
        .unwrap();
        assert_eq!(out, "[a][b]");
    }

    #[test]
    fn python_string_methods_work() {
        let out = render(
            "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' x') }}",
            &[Message::text("user", " xy ")],
        )
        .unwrap();
        assert_eq!(out, "XY|True");
    }

    #[test]
    fn tojson_writes_python_json() {
        let out = render(
            "{{ {'b': 'é\"', 'a': [1, 2.5, none, true]}|tojson }}|{{ [1, {'k': 'v'}]|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true, separators=[',', ':']) }}|{{ 'é'|tojson(ensure_ascii=true) }}",
            &[],
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"b\": \"é\\\"\", \"a\": [1, 2.5, null, true]}|[\n  1,\n  {\n    \"k\": \"v\"\n  }\n]|{\"a\":2,\"b\":1}|\"\\u00e9\""
        );
    }

    #[test]
    fn strftime_now_formats_the_date() {
        let out = render("{{ strftime_now('%Y') }}", &[]).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with("20"), "{out}");
    }

    #[test]
    fn continue_final_message_leaves_the_turn_open() {
        let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
        let template = ChatTemplate::new(source, SpecialTokens::default()).unwrap();
        let messages = [
            Message::text("user", "hi"),
            Message::text("assistant", "Once upon "),
        ];
        let options = RenderOptions {
            continue_final_message: true,
            ..RenderOptions::default()
        };
        assert_eq!(
            template.render(&messages, &options).unwrap(),
            "<user>hi</s>\n<assistant>Once upon "
        );
    }

    #[test]
    fn tool_use_template_is_picked_when_tools_are_given() {
        let template = ChatTemplate::with_names(
            vec![
                ("default".into(), "plain".into()),
                ("tool_use".into(), "tools: {{ tools|length }}".into()),
            ],
            SpecialTokens::default(),
        )
        .unwrap();
        let mut options = RenderOptions::default();
        assert_eq!(template.render(&[], &options).unwrap(), "plain");
        options.tools = Some(vec![serde_json::json!({"name": "f"})]);
        assert_eq!(template.render(&[], &options).unwrap(), "tools: 1");
    }

    #[test]
    fn syntax_errors_name_the_template() {
        let err = ChatTemplate::new("{% if %}", SpecialTokens::default()).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Syntax { ref name, .. } if name == "default"),
            "{err}"
        );
    }

    #[test]
    fn chat_template_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }
}
