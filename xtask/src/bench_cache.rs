//! `cargo xtask bench --cache`: time to first token of a conversation whose prompt is about 4096
//! tokens (a system message and a log of varied entries in one user message, sized with the
//! worker's `tokenize` on the templated conversation), cold and warm from each tier of the
//! worker's prompt cache (issue 36). Each round, on each model:
//! - worker A, the release worker started with `--disk-cache-bytes` and `MLX_WORKER_CACHE` in a
//!   fresh directory, runs turn 1 as its first request (the cold row), then is shut down
//!   (`shutdown`, which writes the entries it holds to `$MLX_WORKER_CACHE/prompt-cache`);
//! - worker B, the same flag and directory, loads the same model and runs turn 2 (turn 1, A's
//!   answer and a short question) as its first request (warm from disk: its `cached_tokens`
//!   should be about all of turn 1 and the answer), then turn 3 the same way (warm in memory:
//!   the same worker's next turn);
//! - a worker that refuses `--disk-cache-bytes` (one without the disk tier) runs turn 1 (cold)
//!   and then turn 2 (warm in memory) in one process instead, and the disk row says so;
//! - mlx-lm cold: turn 1's token ids (the worker's `tokenize`) through mlx-lm 0.32.2's
//!   `stream_generate` (`xtask/bench/mlx_lm_prefill.py`, with Debian's OpenBLAS preloaded, which
//!   the worker links itself; `--no-openblas`: stock), the reference of the ratios: mlx-lm keeps no
//!   prompt cache between requests and has no disk tier. Its process warms up once (a short
//!   prompt) and then prefills turn 1 once a round.
//!
//! The models: SmolLM2 (the default model) and a hybrid, the Qwen3-Next parity fixture
//! (`tiny-qwen3-next`: delta-net layers beside full attention, built by mlx-lm's classes from
//! `xtask/parity/cases.json`'s spec). Every round has its own fresh `MLX_WORKER_CACHE`, so no run
//! finds another's files. Medians over the rounds. The bench reports what it measures and asserts
//! nothing about speed: a worker that finds nothing on disk reports 0 cached tokens.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use protocol::methods::{ChatMessage, GenerateParams, LoadParams, Tokenize, TokenizeParams};
use serde_json::{json, Value};

use crate::bench::{median, MlxLm, Options, Worker};
use crate::{parity, setup, venv, workspace_root};

/// Turn 1's templated prompt is sized to at most this many tokens (and within an entry of it).
const TARGET_TOKENS: usize = 4096;
/// The disk tier's budget the two disk-tier workers are started with.
const DISK_CACHE_BYTES: u64 = 4_000_000_000;
/// The hybrid parity fixture (`xtask/parity/cases.json`).
const HYBRID: &str = "tiny-qwen3-next";
/// Its context limit for `load`: the fixture's own `max_position_embeddings` is 2048.
const HYBRID_CONTEXT: u64 = 8192;
/// Tokens generated per turn unless `--max-new-tokens`: turn 1's answer goes into turn 2.
const ANSWER_TOKENS: u32 = 16;
/// The mlx-lm side, in `xtask/bench/`.
const SCRIPT: &str = "mlx_lm_prefill.py";

const SYSTEM: &str = "You are the archivist of the Gannet Rock lighthouse. Answer questions \
                      about the keeper's log exactly and briefly.";
/// Turn 2's question, and turn 3's.
const FOLLOW_UP: &str = "Which entry first mentions the fog signal? Answer with its day only.";
const SECOND_FOLLOW_UP: &str = "And who tested it that day?";

/// A model the rows run on.
struct Model {
    title: &'static str,
    dir: PathBuf,
    load: LoadParams,
}

/// One measured turn.
#[derive(Debug, Clone, Copy)]
struct Measured {
    prompt_tokens: u64,
    cached_tokens: Option<u64>,
    prompt_ms: f64,
    ttft_ms: f64,
}

/// The rows of one model's table, in order.
const ROWS: usize = 4;
const COLD: usize = 0;
const WARM_MEMORY: usize = 1;
const WARM_DISK: usize = 2;
const MLX_LM: usize = 3;

/// What one model's rounds measured.
struct Results {
    /// rows[row] = one sample per round that ran it.
    rows: [Vec<Measured>; ROWS],
    /// Lines printed under the table (a refused flag, what the disk tier wrote).
    notes: Vec<String>,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if opts.skip_worker {
        bail!("--cache measures the worker: --skip-worker does not apply");
    }
    let answer_tokens = opts.max_new_tokens.unwrap_or(ANSWER_TOKENS);
    let bin = opts.worker_bin()?;
    let python = venv::reference_python()?;
    let smollm2 = setup::default_model_dir()
        .context("the benchmark model is missing: run `cargo xtask setup`")?;
    let mut hybrid_load = LoadParams::new(hybrid_fixture()?.display().to_string());
    hybrid_load.max_seq_length = HYBRID_CONTEXT;
    let models = [
        Model {
            title: "SmolLM2-135M-Instruct (float32)",
            load: LoadParams::new(smollm2.display().to_string()),
            dir: smollm2,
        },
        Model {
            title: "tiny-qwen3-next (hybrid: delta-net and full attention layers, random \
                    weights, hidden 64, float32)",
            dir: PathBuf::from(&hybrid_load.model),
            load: hybrid_load,
        },
    ];
    let scratch =
        std::env::temp_dir().join(format!("mlx-worker-bench-cache-{}", std::process::id()));
    let runtime = tokio::runtime::Runtime::new()?;
    let result = (|| {
        // The conversation, sized on the default model's tokenizer (the fixture shares it).
        let entries = runtime.block_on(size_conversation(&bin, &models[0], &scratch))?;
        let turn1 = turn_one(entries);
        let mut tables = Vec::new();
        for model in &models {
            eprintln!("bench --cache: {}", model.title);
            let results = runtime.block_on(measure_model(
                &bin,
                &python,
                model,
                &turn1,
                opts,
                answer_tokens,
                &scratch,
            ))?;
            tables.push(results);
        }
        println!();
        println!(
            "Prompt cache tiers: turn 1 is a system message and a log of {entries} entries in one \
             user message; each next turn adds the assistant's answer and a short question. \
             Greedy, {answer_tokens} new tokens a turn (mlx-lm: 1), median of {} round(s). cold: \
             worker A's turn 1 (started with --disk-cache-bytes {DISK_CACHE_BYTES}); warm from \
             disk: worker B's turn 2 after A's shutdown (same flag and MLX_WORKER_CACHE); warm in \
             memory: B's turn 3 (a worker without the flag: one worker's turn 1, then turn 2). \
             prompt ms: the worker's timings.prompt_ms (mlx-lm: stream_generate's prompt time); \
             TTFT ms: wall time from sending the request to its first delta (mlx-lm: from the \
             request read to its first token, in its process); ratio: mlx-lm's cold turn 1 over \
             the row (above 1: sooner than mlx-lm's cold prefill).",
            opts.runs
        );
        let reference = if opts.openblas {
            "mlx-lm+OpenBLAS"
        } else {
            "mlx-lm"
        };
        for (model, results) in models.iter().zip(&tables) {
            print_table(model, results, reference);
        }
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// The hybrid parity fixture, built (if missing or stale) from `cases.json`'s spec alone.
fn hybrid_fixture() -> anyhow::Result<PathBuf> {
    let cases_path = workspace_root().join("xtask/parity/cases.json");
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(&cases_path)
            .with_context(|| format!("reading {}", cases_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", cases_path.display()))?;
    let entry = (cases["models"].as_array().into_iter().flatten())
        .find(|m| m["name"] == HYBRID)
        .with_context(|| format!("{} has no model {HYBRID}", cases_path.display()))?;
    let one = std::env::temp_dir().join(format!(
        "mlx-worker-bench-cache-{}-fixture.json",
        std::process::id()
    ));
    std::fs::write(&one, json!({ "models": [entry] }).to_string())
        .with_context(|| format!("writing {}", one.display()))?;
    let fixtures = parity::make_fixtures(&one);
    let _ = std::fs::remove_file(&one);
    Ok(fixtures?.join(HYBRID))
}

/// Entry `i` of the keeper's log: varied words and numbers, about 55 tokens.
fn log_entry(i: usize) -> String {
    const WHO: [&str; 7] = [
        "Mara Ellison",
        "the harbour master",
        "old Tomas Reyes",
        "the ferry's engineer",
        "a coastguard officer",
        "the keeper's assistant",
        "Ines from the chandlery",
    ];
    const DID: [&str; 6] = [
        "replaced a cracked panel of the lens",
        "logged a squall coming in from the south-west",
        "counted the seals hauled out on the reef",
        "repainted a stretch of the gallery railings",
        "tested the fog signal and oiled its bearings",
        "rowed out with fresh water, paraffin and candles",
    ];
    const WEATHER: [&str; 5] = [
        "under a low grey sky",
        "in a steady drizzle",
        "while the tide was turning",
        "in bright, cold sunshine",
        "as fog rolled in across the bay",
    ];
    const SEEN: [&str; 8] = [
        "trawlers",
        "gannets diving",
        "yachts",
        "crab boats",
        "porpoises",
        "cargo ships",
        "rowing boats",
        "terns",
    ];
    format!(
        "Day {}: {} {} {}. The barometer read {} millibars, the wind was {} knots and {} {} were \
         seen from the gallery before {}:{:02}.",
        i + 1,
        WHO[i % WHO.len()],
        DID[(i * 5 + 1) % DID.len()],
        WEATHER[(i * 3 + 2) % WEATHER.len()],
        975 + (i * 37) % 46,
        3 + (i * 11) % 38,
        2 + (i * 7) % 17,
        SEEN[(i * 3) % SEEN.len()],
        5 + (i * 5) % 16,
        (i * 13) % 60,
    )
}

/// Turn 1 with `entries` log entries.
fn turn_one(entries: usize) -> Vec<ChatMessage> {
    let log: Vec<String> = (0..entries).map(log_entry).collect();
    vec![
        ChatMessage::new("system", SYSTEM),
        ChatMessage::new(
            "user",
            format!(
                "Here is the keeper's log for the season.\n\n{}\n\nIn one sentence: what kept \
                 the keepers busiest?",
                log.join("\n")
            ),
        ),
    ]
}

/// The next turn: `before`, its answer, and a short question.
fn next_turn(before: &[ChatMessage], answer: &str, question: &str) -> Vec<ChatMessage> {
    let mut messages = before.to_vec();
    messages.push(ChatMessage::new("assistant", answer));
    messages.push(ChatMessage::new("user", question));
    messages
}

/// The worker's token ids of the templated `messages` (with the generation prompt), as
/// `generate` would run them.
async fn tokenize(worker: &Worker, messages: &[ChatMessage]) -> anyhow::Result<Vec<u32>> {
    let params: TokenizeParams = serde_json::from_value(json!({ "messages": messages }))?;
    let result = worker
        .client
        .call::<Tokenize>(&params)
        .await
        .context("worker: tokenize")?;
    Ok(result.tokens)
}

/// How many log entries make turn 1 the longest prompt of at most [`TARGET_TOKENS`] tokens.
async fn size_conversation(bin: &Path, model: &Model, scratch: &Path) -> anyhow::Result<usize> {
    let cache = fresh_dir(&scratch.join("tokenize"))?;
    let worker = Worker::start_env(bin, &[], &[("MLX_WORKER_CACHE", &cache)], &model.load).await?;
    let count = |n: usize| {
        let worker = &worker;
        async move { anyhow::Ok(tokenize(worker, &turn_one(n)).await?.len()) }
    };
    let (base, ten) = (count(0).await?, count(10).await?);
    let per = ((ten - base) / 10).max(1);
    let mut n = TARGET_TOKENS.saturating_sub(base) / per;
    while n > 0 && count(n).await? > TARGET_TOKENS {
        n -= 1;
    }
    while count(n + 1).await? <= TARGET_TOKENS {
        n += 1;
    }
    worker.client.shutdown().await.ok();
    Ok(n)
}

/// `dir`, emptied (made if missing).
fn fresh_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// Every row of `model`'s table, `opts.runs` rounds.
async fn measure_model(
    bin: &Path,
    python: &Path,
    model: &Model,
    turn1: &[ChatMessage],
    opts: &Options,
    answer_tokens: u32,
    scratch: &Path,
) -> anyhow::Result<Results> {
    // Turn 1's ids for mlx-lm, from this model's own tokenizer.
    let ids = {
        let cache = fresh_dir(&scratch.join("tokenize"))?;
        let w = Worker::start_env(bin, &[], &[("MLX_WORKER_CACHE", &cache)], &model.load).await?;
        let ids = tokenize(&w, turn1).await?;
        w.client.shutdown().await.ok();
        ids
    };
    let mut mlx_lm = match opts.openblas {
        true => MlxLm::start_openblas(python, SCRIPT, &[&model.dir])?,
        false => MlxLm::start_script(python, SCRIPT, &[&model.dir], None)?,
    };
    // Warm-up: the first generation of a process pays for one-off setup.
    mlx_lm.request(&json!({"tokens": &ids[..ids.len().min(32)], "max_new_tokens": 1}))?;

    let disk_args = vec![
        "--disk-cache-bytes".to_owned(),
        DISK_CACHE_BYTES.to_string(),
    ];
    let mut results = Results {
        rows: Default::default(),
        notes: Vec::new(),
    };
    let disk_tier = has_disk_tier(bin)?;
    if !disk_tier {
        results.notes.push(
            "warm from disk not run: this worker has no disk tier (its --help lists no \
             --disk-cache-bytes); one worker ran turn 1, then turn 2"
                .into(),
        );
    }
    for round in 1..=opts.runs {
        eprintln!("bench --cache: round {round}/{}", opts.runs);
        let cache = fresh_dir(&scratch.join(format!("round-{round}")))?;
        let env = [("MLX_WORKER_CACHE", cache.as_path())];
        match disk_tier {
            // The disk tier: A runs turn 1 and shuts down; B runs turn 2, then turn 3.
            true => {
                let a = Worker::start_env(bin, &disk_args, &env, &model.load).await?;
                let (cold, answer) = turn(&a, turn1, answer_tokens).await?;
                let start = Instant::now();
                a.client.shutdown().await.context("worker A: shutdown")?;
                let shutdown_ms = start.elapsed().as_secs_f64() * 1000.0;
                let (files, bytes) = dir_size(&cache.join("prompt-cache"));
                let start = Instant::now();
                let b = Worker::start_env(bin, &disk_args, &env, &model.load).await?;
                let start_ms = start.elapsed().as_secs_f64() * 1000.0;
                note(
                    &mut results,
                    format!(
                        "round {round}: worker A's shutdown took {shutdown_ms:.0} ms, after it \
                         $MLX_WORKER_CACHE/prompt-cache held {files} files, {:.1} MB; worker B \
                         started and loaded in {start_ms:.0} ms",
                        bytes as f64 / 1e6
                    ),
                );
                let turn2 = next_turn(turn1, &answer, FOLLOW_UP);
                let (from_disk, answer) = turn(&b, &turn2, answer_tokens).await?;
                let turn3 = next_turn(&turn2, &answer, SECOND_FOLLOW_UP);
                let (warm, _) = turn(&b, &turn3, answer_tokens).await?;
                b.client.shutdown().await.ok();
                results.rows[COLD].push(cold);
                results.rows[WARM_DISK].push(from_disk);
                results.rows[WARM_MEMORY].push(warm);
            }
            // No disk tier: one worker runs turn 1, then turn 2.
            false => {
                let w = Worker::start_env(bin, &[], &env, &model.load).await?;
                let (cold, answer) = turn(&w, turn1, answer_tokens).await?;
                let turn2 = next_turn(turn1, &answer, FOLLOW_UP);
                let (warm, _) = turn(&w, &turn2, answer_tokens).await?;
                w.client.shutdown().await.ok();
                results.rows[COLD].push(cold);
                results.rows[WARM_MEMORY].push(warm);
            }
        }
        let _ = std::fs::remove_dir_all(&cache);
        let ran = results.rows[COLD]
            .last()
            .expect("just pushed")
            .prompt_tokens;
        if ran != ids.len() as u64 {
            note(
                &mut results,
                format!(
                    "WARNING: turn 1 ran {ran} prompt tokens, tokenize gave {}",
                    ids.len()
                ),
            );
        }

        results.rows[MLX_LM].push(prefill(&mut mlx_lm, &ids)?);
    }
    Ok(results)
}

/// `line` under the table, once.
fn note(results: &mut Results, line: String) {
    if !results.notes.contains(&line) {
        results.notes.push(line);
    }
}

/// One measured turn on `worker`: its result's usage and prompt time, the wall time to its
/// first delta, and the answer's text.
async fn turn(
    worker: &Worker,
    messages: &[ChatMessage],
    max: u32,
) -> anyhow::Result<(Measured, String)> {
    let mut params = GenerateParams::new(messages.to_vec());
    params.max_new_tokens = max;
    params.sampling.temperature = 0.0;
    let start = Instant::now();
    let mut handle = worker
        .client
        .generate(&params)
        .context("worker: sending generate")?;
    let first = handle.next_delta().await.map(|_| start.elapsed());
    let result = handle
        .finish()
        .await
        .with_context(|| format!("worker: generate (stderr: {})", worker.client.stderr_tail()))?;
    let ttft = first.unwrap_or_else(|| start.elapsed());
    Ok((
        Measured {
            prompt_tokens: result.usage.prompt_tokens,
            cached_tokens: Some(result.usage.cached_tokens),
            prompt_ms: result.timings.prompt_ms,
            ttft_ms: ttft.as_secs_f64() * 1000.0,
        },
        result.text,
    ))
}

/// `ids` prefilled by mlx-lm from an empty cache: `mlx_lm_prefill.py`'s answer.
fn prefill(mlx_lm: &mut MlxLm, ids: &[u32]) -> anyhow::Result<Measured> {
    let a = mlx_lm.request(&json!({"tokens": ids, "max_new_tokens": 1}))?;
    let num = |k: &str| {
        a[k].as_f64()
            .with_context(|| format!("{SCRIPT}: no {k} in {a}"))
    };
    Ok(Measured {
        prompt_tokens: num("prompt_tokens")? as u64,
        cached_tokens: None,
        prompt_ms: num("prompt_ms")?,
        ttft_ms: num("ttft_ms")?,
    })
}

/// Files under `dir` (recursively) and their bytes; nothing when it is missing.
fn dir_size(dir: &Path) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let (mut files, mut bytes) = (0, 0);
    for entry in entries.flatten() {
        match entry.metadata() {
            Ok(m) if m.is_dir() => {
                let (f, b) = dir_size(&entry.path());
                (files, bytes) = (files + f, bytes + b);
            }
            Ok(m) => (files, bytes) = (files + 1, bytes + m.len()),
            Err(_) => {}
        }
    }
    (files, bytes)
}

/// Whether `bin` has the disk tier: its `--help` lists `--disk-cache-bytes`.
fn has_disk_tier(bin: &Path) -> anyhow::Result<bool> {
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .with_context(|| format!("running {} --help", bin.display()))?;
    Ok(String::from_utf8_lossy(&help.stdout).contains("--disk-cache-bytes"))
}

fn print_table(model: &Model, results: &Results, reference: &str) {
    let labels: [String; ROWS] = [
        "cold: a fresh worker's first request (turn 1)".into(),
        "warm in memory: the same worker's next turn".into(),
        "warm from disk: worker B's first request (turn 2)".into(),
        format!("{reference} cold: turn 1's ids"),
    ];
    let med = |row: usize, f: fn(&Measured) -> f64| {
        let v = &results.rows[row];
        (!v.is_empty()).then(|| median(v.iter().map(f).collect()))
    };
    let (ref_prompt, ref_ttft) = (med(MLX_LM, |m| m.prompt_ms), med(MLX_LM, |m| m.ttft_ms));
    println!();
    println!("{}:", model.title);
    println!(
        "| row | prompt tokens | cached tokens | prompt ms | TTFT ms | prompt ms ratio | TTFT ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (row, label) in labels.iter().enumerate() {
        let v = &results.rows[row];
        let range = |f: fn(&Measured) -> Option<u64>| -> String {
            let all: Vec<u64> = v.iter().filter_map(f).collect();
            match (all.iter().min(), all.iter().max()) {
                (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
                (Some(lo), Some(hi)) => format!("{lo}..{hi}"),
                _ => "-".into(),
            }
        };
        let ms = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.0}"));
        let ratio = |reference: Option<f64>, x: Option<f64>| match (reference, x) {
            (Some(r), Some(x)) if x > 0.0 => format!("{:.2}x", r / x),
            _ => "-".into(),
        };
        let (prompt, ttft) = (med(row, |m| m.prompt_ms), med(row, |m| m.ttft_ms));
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            range(|m| Some(m.prompt_tokens)),
            range(|m| m.cached_tokens),
            ms(prompt),
            ms(ttft),
            ratio(ref_prompt, prompt),
            ratio(ref_ttft, ttft),
        );
    }
    for line in &results.notes {
        println!("{line}");
    }
}
