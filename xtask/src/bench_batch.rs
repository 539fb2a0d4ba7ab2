//! `cargo xtask bench --batch`: aggregate decode throughput with several chats at once. The
//! release worker (started with `--max-batch` the widest width: up to that many `generate`s of
//! one model share each decode step's forward pass) beside mlx-lm's `BatchGenerator`
//! (`xtask/bench/mlx_lm_batch.py`, model loaded once), stock and with OpenBLAS, in the same run.
//!
//! At width W, the first W prompts of `xtask/bench/batch.json` are sent at once, greedy, the same
//! budget each. Aggregate tok/s = the generated tokens of all W streams / the wall time from the
//! moment all W were sent until the last answer; ttft per stream from the same moment. Each round
//! runs every width on each side in turn; medians over the rounds.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use protocol::methods::{ChatMessage, GenerateParams, LoadParams, Reset, ResetParams};
use serde::Deserialize;
use serde_json::json;

use crate::bench::{median, MlxLm, Options, Worker};
use crate::{setup, venv, workspace_root};

/// The mlx-lm side, in `xtask/bench/`.
const SCRIPT: &str = "mlx_lm_batch.py";

/// `xtask/bench/batch.json`: one user message per chat, answers that run long.
#[derive(Debug, Deserialize)]
struct BatchFile {
    max_new_tokens: u32,
    prompts: Vec<String>,
}

/// One width's run on one side.
#[derive(Debug, Clone)]
struct Run {
    /// Tokens each stream generated (the EOS that ended one not counted).
    generated: Vec<u64>,
    /// From all sent to the last answer.
    wall: Duration,
    /// From all sent to each stream's first token.
    ttft_ms: Vec<f64>,
}

impl Run {
    fn total(&self) -> u64 {
        self.generated.iter().sum()
    }

    fn tps(&self) -> f64 {
        self.total() as f64 / self.wall.as_secs_f64()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The worker started with `--batch-attention` the n-th of `Options::batch_attention`
    /// (its only one when none was given).
    Worker(usize),
    MlxLm,
    MlxLmOpenBlas,
}

impl Side {
    fn name(self, opts: &Options) -> String {
        match self {
            Side::Worker(n) => {
                let modes = opts.batch_attention.len().max(1);
                let mut name = "worker".to_owned();
                if opts.worker.len() > 1 {
                    let bin = &opts.worker[n / modes];
                    let dir = bin.parent().and_then(|d| d.file_name());
                    name += &format!(" {}", dir.map_or("?".into(), |d| d.to_string_lossy()));
                }
                if modes > 1 {
                    name += &format!(" {}", opts.batch_attention[n % modes]);
                }
                name
            }
            Side::MlxLm => "mlx-lm".into(),
            Side::MlxLmOpenBlas => "mlx-lm+OpenBLAS".into(),
        }
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let file = batch_file()?;
    let max = opts.max_new_tokens.unwrap_or(file.max_new_tokens);
    let widest = *opts.widths.iter().max().expect("clap requires a width");
    if widest as usize > file.prompts.len() {
        bail!(
            "--widths: {widest} chats at once, but xtask/bench/batch.json has {} prompts; add \
             prompts or pass smaller widths",
            file.prompts.len()
        );
    }
    let chats: Vec<Vec<ChatMessage>> = (file.prompts.iter())
        .map(|p| vec![ChatMessage::new("user", p.as_str())])
        .collect();
    let model = setup::default_model_dir()
        .context("the benchmark model is missing: run `cargo xtask setup`")?;
    let python = venv::reference_python()?;

    let runtime = tokio::runtime::Runtime::new()?;
    let mut workers = Vec::new();
    if !opts.skip_worker {
        let load = LoadParams::new(model.display().to_string());
        let modes: Vec<Option<&str>> = match opts.batch_attention.is_empty() {
            true => vec![None],
            false => opts
                .batch_attention
                .iter()
                .map(|m| Some(m.as_str()))
                .collect(),
        };
        for bin in opts.worker_bins()? {
            for &mode in &modes {
                workers.push(runtime.block_on(start_worker(&bin, &load, widest, mode))?);
            }
        }
    }
    let mut stock = MlxLm::start_script(&python, SCRIPT, &[&model], None)?;
    let mut openblas = (opts.openblas)
        .then(|| MlxLm::start_openblas(&python, SCRIPT, &[&model]))
        .transpose()?;

    let mut sides: Vec<Side> = (0..workers.len()).map(Side::Worker).collect();
    sides.push(Side::MlxLm);
    if openblas.is_some() {
        sides.push(Side::MlxLmOpenBlas);
    }
    let mut measure = |side: Side, width: u32, max: u32| -> anyhow::Result<Run> {
        let chats = &chats[..width as usize];
        match side {
            Side::Worker(n) => runtime.block_on(worker_batch(&workers[n], chats, max)),
            Side::MlxLm => mlx_lm_batch(&mut stock, chats, max),
            Side::MlxLmOpenBlas => {
                mlx_lm_batch(openblas.as_mut().expect("openblas side"), chats, max)
            }
        }
    };

    // Warm-up: the first generation of a process pays for one-off setup on every side.
    eprintln!("bench --batch: warm-up");
    for &side in &sides {
        measure(side, 1, 8)?;
    }
    // runs[width][side] = one run per round.
    let mut runs = vec![vec![Vec::new(); sides.len()]; opts.widths.len()];
    for round in 1..=opts.runs {
        for (w, &width) in opts.widths.iter().enumerate() {
            eprintln!("bench --batch: round {round}/{}, width {width}", opts.runs);
            for (s, &side) in sides.iter().enumerate() {
                runs[w][s].push(measure(side, width, max)?);
            }
        }
    }
    for w in workers {
        runtime.block_on(w.client.shutdown()).ok();
    }
    drop(stock);
    drop(openblas);
    print_tables(opts, &sides, &runs, max);
    Ok(())
}

fn batch_file() -> anyhow::Result<BatchFile> {
    let path = workspace_root().join("xtask/bench/batch.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid batch bench file", path.display()))
}

/// The worker, started with `--max-batch <widest>` when that is over 1 (and `attention` as its
/// `--batch-attention`), checked to run that many at once.
async fn start_worker(
    bin: &std::path::Path,
    load: &LoadParams,
    widest: u32,
    attention: Option<&str>,
) -> anyhow::Result<Worker> {
    if widest == 1 {
        return Worker::start_with(bin, load).await;
    }
    let mut args = vec!["--max-batch".to_owned(), widest.to_string()];
    if let Some(mode) = attention {
        args.extend(["--batch-attention".to_owned(), mode.to_owned()]);
    }
    let worker = Worker::start_args(bin, &args, load).await.context(
        "a worker without continuous batching refuses --max-batch: pass --widths 1 to measure it",
    )?;
    let max_batch = &worker.initialized["capabilities"]["max_batch"];
    if max_batch.as_u64() != Some(u64::from(widest)) {
        bail!(
            "the worker was started with --max-batch {widest} but its capabilities.max_batch \
             is {max_batch}"
        );
    }
    let mode = &worker.initialized["capabilities"]["batch_attention"];
    eprintln!("bench --batch: the worker's batches attend by {mode}");
    Ok(worker)
}

/// All `chats` sent to the worker at once (from an empty prompt cache).
async fn worker_batch(
    worker: &Worker,
    chats: &[Vec<ChatMessage>],
    max: u32,
) -> anyhow::Result<Run> {
    let client = &worker.client;
    client
        .call::<Reset>(&ResetParams::default())
        .await
        .context("worker: reset")?;
    let handles = chats
        .iter()
        .map(|messages| {
            let mut params = GenerateParams::new(messages.clone());
            params.max_new_tokens = max;
            params.sampling.temperature = 0.0;
            client.generate(&params)
        })
        .collect::<Result<Vec<_>, _>>()
        .context("worker: sending generate")?;
    let start = Instant::now();
    let streams: Vec<_> = handles
        .into_iter()
        .map(|mut handle| {
            tokio::spawn(async move {
                let first = handle.next_delta().await.map(|_| start.elapsed());
                let result = handle.finish().await;
                (first, start.elapsed(), result)
            })
        })
        .collect();
    let mut run = Run {
        generated: Vec::new(),
        wall: Duration::ZERO,
        ttft_ms: Vec::new(),
    };
    for stream in streams {
        let (first, done, result) = stream.await.context("worker: a stream's task")?;
        let result = result
            .with_context(|| format!("worker: generate (stderr: {})", client.stderr_tail()))?;
        run.generated.push(result.timings.predicted_n);
        run.ttft_ms
            .push(first.unwrap_or(done).as_secs_f64() * 1000.0);
        run.wall = run.wall.max(done);
    }
    Ok(run)
}

/// All `chats` in one `BatchGenerator`: `mlx_lm_batch.py`'s answer.
fn mlx_lm_batch(mlx_lm: &mut MlxLm, chats: &[Vec<ChatMessage>], max: u32) -> anyhow::Result<Run> {
    let a = mlx_lm.request(&json!({"prompts": chats, "max_new_tokens": max}))?;
    let list = |k: &str| -> anyhow::Result<Vec<f64>> {
        (a[k].as_array().into_iter().flatten())
            .map(|v| v.as_f64())
            .collect::<Option<Vec<f64>>>()
            .filter(|v| v.len() == chats.len())
            .with_context(|| format!("{SCRIPT}: no {k} per stream in {a}"))
    };
    let wall = (a["wall_s"].as_f64()).with_context(|| format!("{SCRIPT}: no wall_s in {a}"))?;
    Ok(Run {
        generated: list("generated")?.into_iter().map(|n| n as u64).collect(),
        wall: Duration::from_secs_f64(wall),
        ttft_ms: list("ttft_ms")?,
    })
}

fn print_tables(opts: &Options, sides: &[Side], runs: &[Vec<Vec<Run>>], max: u32) {
    let tps = |w: usize, s: usize| median(runs[w][s].iter().map(Run::tps).collect());
    let one = opts.widths.iter().position(|&w| w == 1);
    let workers: Vec<usize> = (0..sides.len())
        .filter(|&s| matches!(sides[s], Side::Worker(_)))
        .collect();
    let name = |s: usize| sides[s].name(opts);

    println!();
    let attention = match opts.batch_attention.is_empty() {
        true => "auto (the default)".to_owned(),
        false => opts.batch_attention.join(", "),
    };
    println!(
        "SmolLM2-135M-Instruct (float32), W chats at once (batch.json's first W prompts), \
         greedy, at most {max} new tokens each, median of {} runs; worker --batch-attention \
         {attention}",
        opts.runs
    );
    println!(
        "tok/s = all streams' generated tokens / wall time from all W sent to the last answer \
         (prefill included); \
         A / B = A's tok/s over B's; W/1 = the side's tok/s at W over its tok/s at width 1"
    );
    let references: Vec<usize> = (0..sides.len()).filter(|s| !workers.contains(s)).collect();
    let mut head = vec!["width".to_owned()];
    head.extend((0..sides.len()).map(|s| format!("{} tok/s", name(s))));
    for &r in &references {
        head.extend(
            workers
                .iter()
                .map(|&w| format!("{} / {}", name(w), name(r))),
        );
    }
    if one.is_some() {
        head.extend((0..sides.len()).map(|s| format!("{} W/1", name(s))));
    }
    print_row(&head);
    print_row(&vec!["---".to_owned(); head.len()]);
    for (w, width) in opts.widths.iter().enumerate() {
        let mut row = vec![width.to_string()];
        row.extend((0..sides.len()).map(|s| format!("{:.1}", tps(w, s))));
        for &r in &references {
            row.extend((workers.iter()).map(|&ws| format!("{:.2}x", tps(w, ws) / tps(w, r))));
        }
        if let Some(one) = one {
            row.extend((0..sides.len()).map(|s| format!("{:.2}x", tps(w, s) / tps(one, s))));
        }
        print_row(&row);
    }

    // ttft, and what was generated: short answers (EOS) make a rate of fewer tokens.
    println!();
    println!(
        "ttft ms: median over every stream of every run, from all W sent to the stream's first \
         token (worker: its first delta); generated: all streams' tokens per run, min..max"
    );
    let mut head = vec!["width".to_owned()];
    head.extend((0..sides.len()).map(|s| format!("{} ttft ms", name(s))));
    head.extend((0..sides.len()).map(|s| format!("{} generated", name(s))));
    print_row(&head);
    print_row(&vec!["---".to_owned(); head.len()]);
    let mut short = false;
    for (w, &width) in opts.widths.iter().enumerate() {
        let mut row = vec![width.to_string()];
        for side_runs in &runs[w] {
            let ttft = side_runs.iter().flat_map(|r| r.ttft_ms.iter().copied());
            row.push(format!("{:.0}", median(ttft.collect())));
        }
        for side_runs in &runs[w] {
            let totals = side_runs.iter().map(Run::total);
            let (lo, hi) = (totals.clone().min(), totals.max());
            row.push(format!("{}..{}", lo.unwrap_or(0), hi.unwrap_or(0)));
            short |= lo.is_some_and(|lo| lo < u64::from(width * max));
        }
        print_row(&row);
    }
    if short {
        println!(
            "WARNING: some streams stopped before {max} tokens (EOS): compare generated tokens"
        );
    }
}

fn print_row(cells: &[String]) {
    println!("| {} |", cells.join(" | "));
}
