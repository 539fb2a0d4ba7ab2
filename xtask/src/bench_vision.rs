//! `cargo xtask bench --vision`: the release `mlx-worker` beside mlx-vlm 0.7.0 on a vision
//! model with a real model's shapes (`xtask/bench/vision.json`: Gemma 3 4B's SigLIP layer shapes
//! at 896 px (4 of its 27 layers, float32, so that a CPU run takes minutes) and 4 language layers
//! of its width with its whole vocabulary; random weights built by mlx-vlm's classes),
//! one 800 px PNG and a question: time to first token (image decoding, preprocessing, the
//! encoder, prefill) and decode tok/s, medians over the runs, as ratios. mlx-vlm runs first in
//! its own process (`xtask/bench/mlx_vlm_bench.py`), then the worker over the protocol; each
//! side warms up once, and the worker's prompt cache is reset before every run.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use protocol::methods::{ChatMessage, ContentPart, MessageContent};
use serde::Deserialize;

use crate::bench::{median, BenchPrompt, Sample, Worker};
use crate::{parity, venv, worker_bin, workspace_root};

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

pub fn run(runs: u32, max_new_tokens: Option<u32>) -> anyhow::Result<()> {
    let path = workspace_root().join("xtask/bench/vision.json");
    let file: BenchFile = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a valid vision bench file", path.display()))?;
    let max = max_new_tokens.unwrap_or(file.max_new_tokens);
    let fixtures = parity::make_vision_fixtures(&path)?;
    let image = fixtures.join("images").join(&file.image);
    for model in &file.models {
        let dir = fixtures.join(&model.name);
        eprintln!("bench --vision: {} on mlx-vlm ({runs} runs)", model.name);
        let reference = mlx_vlm(&dir, &image, &file.question, max, runs)?;
        eprintln!("bench --vision: {} on the worker ({runs} runs)", model.name);
        let ours = worker(&dir, &image, &file.question, max, runs)?;
        print_table(&model.name, max, &reference, &ours);
    }
    Ok(())
}

fn mlx_vlm(
    dir: &Path,
    image: &Path,
    question: &str,
    max: u32,
    runs: u32,
) -> anyhow::Result<Vec<PySample>> {
    let python = venv::reference_python()?;
    let mut command = Command::new(python);
    // The worker links Debian's OpenBLAS; mlx-vlm gets the same (as in `cargo xtask parity`).
    if cfg!(target_os = "linux") {
        command.env("LD_PRELOAD", venv::DEBIAN_OPENBLAS);
    }
    let out = command
        .arg(workspace_root().join("xtask/bench/mlx_vlm_bench.py"))
        .arg(dir)
        .arg(image)
        .arg(question)
        .arg(max.to_string())
        .arg(runs.to_string())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .context("starting mlx_vlm_bench.py")?;
    if !out.status.success() {
        bail!(
            "mlx_vlm_bench.py failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    #[derive(Deserialize)]
    struct Out {
        samples: Vec<PySample>,
    }
    let parsed: Out = serde_json::from_slice(&out.stdout).context("mlx_vlm_bench.py's answer")?;
    Ok(parsed.samples)
}

fn worker(
    dir: &Path,
    image: &Path,
    question: &str,
    max: u32,
    runs: u32,
) -> anyhow::Result<Vec<Sample>> {
    let bin = worker_bin::build_release()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let prompt = BenchPrompt {
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
    };
    runtime.block_on(async {
        let w = Worker::start(&bin, dir).await?;
        w.generate(&prompt, max).await?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            samples.push(w.generate(&prompt, max).await?);
        }
        w.client.shutdown().await.ok();
        Ok(samples)
    })
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
