//! Loading a Hugging Face model directory: tokenizer.json plus the side files, their
//! precedence, end-of-sequence ids, and prompts encoded without a second BOS.

mod common;

use std::path::{Path, PathBuf};

use serde_json::json;
use text::{
    ChatTemplateSource, Message, ModelFiles, ModelTokenizer, RenderOptions, TokenizerError,
};

/// A scratch model directory, removed when dropped.
struct ModelDir(PathBuf);

impl ModelDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("text-model-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ModelDir(dir)
    }

    fn write(&self, name: &str, contents: &str) -> &Self {
        std::fs::write(self.0.join(name), contents).unwrap();
        self
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chatml_dir(name: &str) -> ModelDir {
    let dir = ModelDir::new(name);
    dir.write(
        "tokenizer.json",
        &common::byte_level_bpe().to_string(false).unwrap(),
    );
    dir.write(
        "tokenizer_config.json",
        &json!({
            "add_bos_token": false,
            "bos_token": {"content": "<|im_start|>", "lstrip": false, "special": true},
            "eos_token": "<|im_end|>",
            "pad_token": "<|im_end|>",
            "chat_template": [
                {"name": "default", "template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
                {"name": "tool_use", "template": "TOOLS {{ tools|length }}"}
            ]
        })
        .to_string(),
    );
    dir.write(
        "config.json",
        &json!({"eos_token_id": 0, "vocab_size": 600}).to_string(),
    );
    dir.write(
        "generation_config.json",
        &json!({"eos_token_id": [2, 1]}).to_string(),
    );
    dir
}

#[test]
fn a_chatml_directory_loads_with_all_its_parts() {
    let dir = chatml_dir("chatml");
    let tokenizer = ModelTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.vocab_size(), 600);
    // config.json (0), generation_config.json (2, 1) and tokenizer_config's eos (2).
    assert_eq!(
        tokenizer
            .eos_token_ids()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(tokenizer.is_eos(2) && !tokenizer.is_eos(3));
    assert_eq!(tokenizer.bos_token(), Some("<|im_start|>"));
    assert_eq!(tokenizer.add_bos_token(), Some(false));
    assert_eq!(
        tokenizer.special_tokens().pad_token.as_deref(),
        Some("<|im_end|>")
    );
    let mut special: Vec<u32> = tokenizer.special_token_ids().iter().copied().collect();
    special.sort();
    assert_eq!(special, [0, 1, 2]);
    assert_eq!(tokenizer.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(
        tokenizer.chat_template_source(),
        ChatTemplateSource::TokenizerConfig
    );
    assert_eq!(
        tokenizer.chat_template_source().as_str(),
        "tokenizer_config"
    );

    let text = "Hello world 😀";
    let ids = tokenizer.encode(text, true).unwrap();
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), text);

    let prompt = tokenizer
        .render_and_encode(&[Message::text("user", "Hi")], &RenderOptions::default())
        .unwrap();
    assert_eq!(
        prompt.text,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(prompt.ids[0], 1, "the prompt starts with <|im_start|>");
    assert_eq!(tokenizer.decode(&prompt.ids, false).unwrap(), prompt.text);

    let with_tools = RenderOptions {
        tools: Some(vec![json!({"name": "f"}), json!({"name": "g"})]),
        ..RenderOptions::default()
    };
    assert_eq!(
        tokenizer.render_and_encode(&[], &with_tools).unwrap().text,
        "TOOLS 2"
    );
}

#[test]
fn template_files_take_precedence_like_transformers() {
    let dir = chatml_dir("precedence");
    dir.write(
        "chat_template.json",
        &json!({"chat_template": "from json"}).to_string(),
    );
    let tokenizer = ModelTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(
        tokenizer.chat_template_source(),
        ChatTemplateSource::ChatTemplateJson
    );
    let render = |t: &ModelTokenizer| {
        t.render_and_encode(&[], &RenderOptions::default())
            .unwrap()
            .text
    };
    assert_eq!(render(&tokenizer), "from json");

    dir.write("chat_template.jinja", "from jinja {{ bos_token }}\n");
    let mut tokenizer = ModelTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(
        tokenizer.chat_template_source(),
        ChatTemplateSource::ChatTemplateJinja
    );
    assert_eq!(render(&tokenizer), "from jinja <|im_start|>");

    tokenizer
        .set_chat_template("override {{ eos_token }}", ChatTemplateSource::Override)
        .unwrap();
    assert_eq!(
        tokenizer.chat_template_source(),
        ChatTemplateSource::Override
    );
    assert_eq!(render(&tokenizer), "override <|im_end|>");
}

#[test]
fn a_template_that_writes_bos_gets_exactly_one() {
    // Llama-style: the post-processor adds <s> on encode(add_special_tokens=true) and the
    // template writes {{ bos_token }} itself.
    let files = ModelFiles {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        chat_templates: Some((
            vec![(
                "default".into(),
                "{{ bos_token }}[INST] {{ messages[0].content }} [/INST]".into(),
            )],
            ChatTemplateSource::Gguf,
        )),
        ..ModelFiles::default()
    };
    let tokenizer = ModelTokenizer::from_parts(common::llama_style_byte_fallback(), files).unwrap();
    let bos = tokenizer.token_to_id("<s>").unwrap();
    assert_eq!(
        tokenizer.encode("Hello", true).unwrap()[0],
        bos,
        "encode adds BOS"
    );
    assert!(tokenizer.is_eos(tokenizer.token_to_id("</s>").unwrap()));
    assert_eq!(tokenizer.chat_template_source().as_str(), "gguf");

    let prompt = tokenizer
        .render_and_encode(&[Message::text("user", "Hello")], &RenderOptions::default())
        .unwrap();
    assert_eq!(prompt.ids[0], bos);
    assert_eq!(
        prompt.ids.iter().filter(|&&id| id == bos).count(),
        1,
        "{:?}",
        prompt.ids
    );
}

#[test]
fn a_directory_without_tokenizer_json_says_what_is_missing() {
    let dir = ModelDir::new("empty");
    let err = ModelTokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, TokenizerError::Missing(_)), "{err}");
    assert!(err.to_string().contains("no tokenizer.json"), "{err}");
}

#[test]
fn broken_side_files_are_errors_that_name_the_file() {
    let dir = chatml_dir("broken");
    dir.write("generation_config.json", "{ not json");
    let err = ModelTokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, TokenizerError::InvalidJson { .. }), "{err}");
    assert!(err.to_string().contains("generation_config.json"), "{err}");
}

#[test]
fn no_chat_template_is_a_clear_error() {
    let tokenizer =
        ModelTokenizer::from_parts(common::byte_level_bpe(), ModelFiles::default()).unwrap();
    assert_eq!(tokenizer.chat_template_source(), ChatTemplateSource::None);
    let err = tokenizer
        .render_and_encode(&[Message::text("user", "hi")], &RenderOptions::default())
        .unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate), "{err}");
}

#[test]
fn smollm2_directory_renders_chatml() {
    let Some(dir) = common::smollm2_dir_if_present() else {
        return;
    };
    let tokenizer = ModelTokenizer::from_dir(&dir).unwrap();
    assert!(tokenizer.is_eos(2), "<|im_end|> ends generation");
    assert_eq!(tokenizer.id_to_token(1).as_deref(), Some("<|im_start|>"));
    let prompt = tokenizer
        .render_and_encode(
            &text::prepend_system_prompt(
                "Be brief.",
                &[Message::text("user", "What is the capital of France?")],
            ),
            &RenderOptions::default(),
        )
        .unwrap();
    assert_eq!(
        prompt.text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(prompt.ids[0], 1);
    assert_eq!(prompt.ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(tokenizer.decode(&prompt.ids, false).unwrap(), prompt.text);
}
