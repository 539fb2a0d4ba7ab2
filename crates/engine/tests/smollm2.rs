//! The real SmolLM2-135M-Instruct (imported by `cargo xtask setup`), greedy, in-process.

use std::path::Path;

use mlx_engine::{
    text, CancelToken, Completion, Engine, GenerateRequest, LoadRequest, Loaded, Prompt,
};

/// Loads `model` (a directory or a .gguf) and asks the capital of France, greedily.
fn ask_capital(model: &Path) -> (Loaded, Completion, String) {
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: model.display().to_string(),
        ..Default::default()
    };
    let loaded = engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    let question = GenerateRequest::greedy(
        Prompt::Chat {
            messages: vec![text::Message::text(
                "user",
                "What is the capital of France?",
            )],
            options: text::RenderOptions::default(),
        },
        20,
    );
    let mut deltas = String::new();
    let out = engine
        .generate(
            &question,
            &mut |d| deltas.push_str(&d.text),
            &CancelToken::new(),
        )
        .unwrap();
    (loaded, out, deltas)
}

#[test]
fn greedy_answer_names_paris() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let (loaded, out, deltas) = ask_capital(&dir);
    assert_eq!(loaded.info.architecture, "llama");
    assert_eq!(loaded.info.vocab_size, 49152);
    assert!(out.text.contains("Paris"), "{:?}", out.text);
    assert_eq!(deltas, out.text);
}

#[test]
fn a_gguf_file_loads_directly() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(gguf) = fixtures::smollm2_gguf() else {
        return;
    };
    let (loaded, out, _) = ask_capital(&gguf);
    assert!(loaded.info.is_gguf);
    assert_eq!(
        loaded.info.chat_template_source,
        text::ChatTemplateSource::Gguf
    );
    assert!(out.text.contains("Paris"), "{:?}", out.text);
}
