//! A damaged checkpoint as the engine loads it: arbitrary bytes as `config.json` (beside a tiny
//! Llama's own weights) or as `model.safetensors` (beside its own config.json), the first byte
//! choosing which. `load` answers the model or an error, never a panic or an abort; a model that
//! loads generates two tokens or answers an error.
#![no_main]

use std::{path::PathBuf, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use mlx_engine::{CancelToken, Engine, GenerateRequest, LoadRequest, Prompt};

/// The tiny Llama every input starts from, written once per process.
fn base() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fuzz-checkpoint-{}", std::process::id()));
        fixtures::write_tiny_llama(&dir.join("base"), &fixtures::TinyLlama::default())
            .expect("write the tiny model");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let model = base().join("model");
    let _ = std::fs::remove_dir_all(&model);
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(base().join("base")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let damaged = match which % 2 {
        0 => "config.json",
        _ => "model.safetensors",
    };
    std::fs::write(model.join(damaged), bytes).unwrap();
    let mut engine = Engine::new();
    let load = LoadRequest {
        model: model.display().to_string(),
        ..Default::default()
    };
    if engine.load(&load, &mut |_| {}, &CancelToken::new()).is_ok() {
        let ask = GenerateRequest::greedy(Prompt::Tokens(vec![5, 6, 7]), 2);
        let _ = engine.generate(&ask, &mut |_| {}, &CancelToken::new());
    }
});
