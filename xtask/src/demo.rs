//! `cargo xtask demo`: the main job end to end. Builds the release `mlx-worker`, provisions the
//! embedded default model, and streams a chat answer through the real protocol over real pipes.

use std::io::Write;

use anyhow::{bail, Context};
use protocol::client::Client;
use serde_json::json;

use crate::{setup, worker_bin};

const DEFAULT_QUESTION: &str = "What is the capital of France? Answer in one sentence.";

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let question = if args.is_empty() {
        DEFAULT_QUESTION.to_owned()
    } else {
        args.join(" ")
    };
    let model = setup::default_model_dir()?;
    let worker = worker_bin::build_release()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(chat(&worker, &model.display().to_string(), &question))
}

async fn chat(worker: &std::path::Path, model: &str, question: &str) -> anyhow::Result<()> {
    let client = Client::spawn(worker, Vec::<String>::new(), [("MLX_WORKER_LOG", "warn")])
        .with_context(|| format!("starting {}", worker.display()))?;
    let init = client
        .request_value(
            "initialize",
            json!({"client": {"name": "xtask-demo", "version": env!("CARGO_PKG_VERSION")}}),
        )
        .await?;
    eprintln!(
        "mlx-worker {} on MLX {} ({}, {})",
        init["worker"]["version"].as_str().unwrap_or("?"),
        init["mlx"]["version"].as_str().unwrap_or("?"),
        init["mlx"]["backend"].as_str().unwrap_or("?"),
        init["mlx"]["device"]["name"].as_str().unwrap_or("?"),
    );
    let loaded = client
        .request_value("load", json!({ "model": model }))
        .await?;
    eprintln!(
        "loaded {} ({}, {} parameters) in {} ms\n",
        loaded["info"]["architecture"].as_str().unwrap_or("?"),
        loaded["info"]["dtype"].as_str().unwrap_or("?"),
        loaded["info"]["num_parameters"],
        loaded["load_ms"],
    );
    println!("> {question}");
    let mut generation = client.generate_value(json!({
        "messages": [{"role": "user", "content": question}],
        "max_new_tokens": 128,
        "temperature": 0.0,
    }))?;
    let mut out = std::io::stdout();
    while let Some(delta) = generation.next_delta().await {
        write!(out, "{}", delta.text)?;
        out.flush()?;
    }
    let result = generation.finish().await?;
    println!();
    let t = &result.timings;
    eprintln!(
        "\n{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, first token after {:.0} ms ({})",
        t.prompt_n, t.prompt_per_second, t.predicted_n, t.predicted_per_second, t.ttft_ms,
        format!("{:?}", result.finish_reason).to_lowercase(),
    );
    if result.text.trim().is_empty() {
        bail!("the model answered nothing");
    }
    client.shutdown().await?;
    Ok(())
}
