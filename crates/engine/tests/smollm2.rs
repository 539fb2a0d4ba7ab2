//! The real SmolLM2-135M-Instruct (imported by `cargo xtask setup`), greedy.

use std::path::PathBuf;

use mlx_engine::{text, CancelToken, Engine, GenerateRequest, LoadRequest, Prompt, SamplerParams};

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MLX_WORKER_SMOLLM2_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("mlx-worker/models/SmolLM2-135M-Instruct"))
        })?;
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("MLX_WORKER_REQUIRE_MODELS").is_none(),
        "SmolLM2 is missing at {}: run `cargo xtask setup`",
        dir.display()
    );
    None
}

#[test]
fn greedy_answer_names_paris() {
    let Some(dir) = model_dir() else { return };
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
