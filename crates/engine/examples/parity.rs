//! The engine's side of `cargo xtask parity`: reads the request that `xtask/parity/reference.py`
//! reads (stdin), answers in the same shape (stdout), so xtask compares the two line for line.
//!
//! Request: `{"model_dir", "adapter_dir"?, "kv_bits"?, "chat_template"?, "max_new_tokens",
//! "cases": [{"name", "messages"}]}`; answer: `{"cases": [{"name", "prompt_ids", "tokens"}]}`.
//! Prompt ids come from our chat template and tokenizer; tokens are greedy, every case from
//! empty caches (as mlx-lm starts each), stopping before EOS.
//!
//! Started as a group of ranks (`cargo xtask parity --ranks N --parallel MODE`: every rank
//! reads the same request and runs the same steps), it splits the model as `"parallel"` asks;
//! rank 0 answers. A model that cannot be split so answers `{"refused": reason}`.

use std::io::Read;

use mlx_engine::{
    text, CancelToken, Engine, EngineError, GenerateRequest, Group, LoadRequest, Parallel, Prompt,
};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Request {
    model_dir: String,
    adapter_dir: Option<String>,
    kv_bits: Option<u8>,
    chat_template: Option<String>,
    max_new_tokens: usize,
    cases: Vec<Case>,
    /// `"pipeline"` or `"tensor"`, in a group.
    #[serde(default)]
    parallel: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<text::Message>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let request: Request = serde_json::from_str(&input)?;
    let mut engine = match Group::from_env()? {
        Some(group) => Engine::new().with_group(group),
        None => Engine::new(),
    };
    let loaded = engine.load(
        &LoadRequest {
            model: request.model_dir.clone(),
            adapter: request.adapter_dir.clone(),
            kv_bits: request.kv_bits,
            chat_template_override: request.chat_template.clone(),
            parallel: match request.parallel.as_deref() {
                Some("tensor") => Some(Parallel::Tensor),
                Some("pipeline") => Some(Parallel::Pipeline),
                _ => None,
            },
            ..Default::default()
        },
        &mut |_| {},
        &CancelToken::new(),
    );
    match loaded {
        Err(EngineError::InvalidParams { field, reason }) if field == "parallel" => {
            println!("{}", json!({ "refused": reason }));
            return Ok(());
        }
        other => drop(other?),
    }
    let mut answers = Vec::new();
    for case in request.cases {
        let prompt = Prompt::Chat {
            messages: case.messages,
            options: text::RenderOptions::default(),
        };
        let ids = engine.prompt_ids(None, &prompt)?;
        let generate = GenerateRequest::greedy(prompt, request.max_new_tokens);
        // No prompt-cache reuse between cases (tests/worker_prompt_cache.rs covers reuse).
        engine.reset(true);
        let got = engine.generate(&generate, &mut |_| {}, &CancelToken::new())?;
        answers.push(json!({"name": case.name, "prompt_ids": ids, "tokens": got.token_ids}));
    }
    println!("{}", json!({ "cases": Value::Array(answers) }));
    Ok(())
}
