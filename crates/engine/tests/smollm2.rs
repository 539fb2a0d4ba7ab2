//! The real SmolLM2-135M-Instruct (imported by `cargo xtask setup`), greedy.

use mlx_engine::{
    fixtures, text, CancelToken, Engine, GenerateRequest, LoadRequest, Prompt, SamplerParams,
};

fn capital_question() -> GenerateRequest {
    GenerateRequest {
        model: None,
        prompt: Prompt::Chat {
            messages: vec![text::Message::text(
                "user",
                "What is the capital of France?",
            )],
            options: text::RenderOptions::default(),
        },
        max_new_tokens: 20,
        sampler: SamplerParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: vec![],
        logprobs: 0,
    }
}

#[test]
fn greedy_answer_names_paris() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: dir.display().to_string(),
        ..Default::default()
    };
    let loaded = engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    assert_eq!(loaded.info.architecture, "llama");
    assert_eq!(loaded.info.vocab_size, 49152);
    let req = GenerateRequest {
        model: None,
        prompt: Prompt::Chat {
            messages: vec![text::Message::text(
                "user",
                "What is the capital of France?",
            )],
            options: text::RenderOptions::default(),
        },
        max_new_tokens: 20,
        sampler: SamplerParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop: vec![],
        logprobs: 0,
    };
    let mut deltas = String::new();
    let out = engine
        .generate(&req, &mut |d| deltas.push_str(&d.text), &CancelToken::new())
        .unwrap();
    eprintln!("{:?} {:?}", out.text, out.timings);
    assert!(out.text.contains("Paris"), "{:?}", out.text);
    assert_eq!(deltas, out.text);
}

#[test]
fn a_gguf_file_loads_directly() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(gguf) = fixtures::smollm2_gguf() else {
        return;
    };
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: gguf.display().to_string(),
        ..Default::default()
    };
    let loaded = engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    assert!(loaded.info.is_gguf);
    assert_eq!(
        loaded.info.chat_template_source,
        text::ChatTemplateSource::Gguf
    );
    let out = engine
        .generate(&capital_question(), &mut |_| {}, &CancelToken::new())
        .unwrap();
    assert!(out.text.contains("Paris"), "{:?}", out.text);
}
