//! `cargo xtask bench --vision`: the release `mlx-worker` beside mlx-vlm 0.7.0 on a vision
//! model with a real model's shapes (`xtask/bench/vision.json`: Gemma 3 4B's SigLIP layer shapes
//! at 896 px (4 of its 27 layers, float32, so that a CPU run takes minutes) and 4 language layers
//! of its width with its whole vocabulary; random weights built by mlx-vlm's classes),
//! one 800 px PNG and a question: time to first token (image decoding, preprocessing, the
//! encoder, prefill) and decode tok/s, medians over the runs, as ratios. mlx-vlm runs in its own
//! long-lived process (`xtask/bench/mlx_vlm_bench.py`), the worker over the protocol; each side
//! warms up once, then every round runs each side once, the two taking turns to go first (a
//! machine that slows down or speeds up over minutes then weighs on both sides alike); the
//! worker's prompt cache is reset before every run.

use std::path::Path;

use anyhow::Context;
use protocol::methods::{ChatMessage, ContentPart, MessageContent};
use serde::Deserialize;
use serde_json::json;

use crate::bench::{median, BenchPrompt, MlxLm, Sample, Worker};
use crate::{parity, venv, workspace_root};

#[derive(Debug, Deserialize)]
struct BenchFile {
    max_new_tokens: u32,
    image: String,
    question: String,
    models: Vec<Model>,
}

#[derive(Debug, Deserialize)]
struct Model {
    name: String,
}

#[derive(Debug, Deserialize)]
struct PySample {
    prompt_tokens: u64,
    generated: u64,
    ttft_ms: f64,
    decode_tps: f64,
}

pub fn run(runs: u32, max_new_tokens: Option<u32>, bin: &Path) -> anyhow::Result<()> {
    let path = workspace_root().join("xtask/bench/vision.json");
    let file: BenchFile = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a valid vision bench file", path.display()))?;
    let max = max_new_tokens.unwrap_or(file.max_new_tokens);
    let fixtures = parity::make_vision_fixtures(&path)?;
    let image = fixtures.join("images").join(&file.image);
    let python = venv::reference_python()?;
    let bin = bin.to_path_buf();
    let runtime = tokio::runtime::Runtime::new()?;
    for model in &file.models {
        let dir = fixtures.join(&model.name);
        eprintln!(
            "bench --vision: {} ({runs} rounds, each side once a round)",
            model.name
        );
        // The worker links Debian's OpenBLAS; mlx-vlm gets the same (as in `cargo xtask parity`).
        let mut reference = MlxLm::start_openblas(&python, SCRIPT, &[&dir])?;
        let request = json!({
            "image": image,
            "question": file.question,
            "max_new_tokens": max,
        });
        let prompt = image_prompt(&image, &file.question);
        let (theirs, ours) = runtime.block_on(async {
            let w = Worker::start(&bin, &dir).await?;
            // One warm-up each, then the rounds, alternating which side goes first.
            reference.request(&request)?;
            w.generate(&prompt, max).await?;
            let (mut theirs, mut ours) = (Vec::new(), Vec::new());
            for round in 0..runs {
                if round % 2 == 0 {
                    theirs.push(mlx_vlm(&mut reference, &request)?);
                    ours.push(w.generate(&prompt, max).await?);
                } else {
                    ours.push(w.generate(&prompt, max).await?);
                    theirs.push(mlx_vlm(&mut reference, &request)?);
                }
            }
            w.client.shutdown().await.ok();
            anyhow::Ok((theirs, ours))
        })?;
        print_table(&model.name, max, &theirs, &ours);
    }
    Ok(())
}

/// mlx-vlm's side, `xtask/bench/`.
const SCRIPT: &str = "mlx_vlm_bench.py";

/// One measured mlx-vlm generation.
fn mlx_vlm(reference: &mut MlxLm, request: &serde_json::Value) -> anyhow::Result<PySample> {
    let answer = reference.request(request)?;
    serde_json::from_value(answer).context("mlx_vlm_bench.py's answer")
}

/// The image first, then the question: one user message, as mlx_vlm_bench.py sends it.
fn image_prompt(image: &Path, question: &str) -> BenchPrompt {
    BenchPrompt {
        name: "image".into(),
        messages: vec![ChatMessage {
            role: "user".into(),
            content: MessageContent::Parts(vec![
                ContentPart::Image {
                    image: image.display().to_string(),
                },
                ContentPart::Text {
                    text: question.into(),
                },
            ]),
            extra: Default::default(),
        }],
        next_turn: false,
        after_another_chat: false,
    }
}

fn print_table(name: &str, max: u32, reference: &[PySample], ours: &[Sample]) {
    let m = |f: fn(&PySample) -> f64| median(reference.iter().map(f).collect());
    let w = |f: fn(&Sample) -> f64| median(ours.iter().map(f).collect());
    let (ttft_m, ttft_w) = (m(|s| s.ttft_ms), w(|s| s.ttft_ms));
    let (dec_m, dec_w) = (m(|s| s.decode_tps), w(|s| s.decode_tps));
    println!();
    println!(
        "{name}: one 800x600 PNG + a question ({} prompt tokens), greedy, up to {max} new tokens \
         (generated: mlx-vlm {}, worker {}), median of {} runs; ratio = worker advantage",
        ours.first().map_or(0, |s| s.prompt_tokens),
        reference.first().map_or(0, |s| s.generated),
        ours.first().map_or(0, |s| s.generated),
        ours.len(),
    );
    println!("| metric | worker | mlx-vlm | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| ttft ms (image in hand to first token) | {ttft_w:.0} | {ttft_m:.0} | {:.2}x |",
        ttft_m / ttft_w
    );
    println!(
        "| decode tok/s | {dec_w:.1} | {dec_m:.1} | {:.2}x |",
        dec_w / dec_m
    );
    if reference.first().map(|s| s.prompt_tokens) != ours.first().map(|s| s.prompt_tokens) {
        println!("WARNING: the two sides' prompts differ in length");
    }
}
