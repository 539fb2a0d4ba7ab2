//! `cargo xtask bench`: the release `mlx-worker` beside mlx-lm 0.32.2, in the same run.
//!
//! The worker is driven through the protocol client over real pipes (load once, then one
//! `generate` per run); mlx-lm runs in two long-lived Python processes
//! (`xtask/bench/mlx_lm_bench.py`, model loaded once): stock, and with Debian's OpenBLAS preloaded
//! (the worker links OpenBLAS itself). Each round runs every prompt on the worker, then on stock
//! mlx-lm, then on mlx-lm + OpenBLAS; medians over the rounds are compared as ratios.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{bail, Context};
use protocol::methods::{ChatMessage, GenerateParams, GenerateResult, LoadParams, StatusParams};
use protocol::Client;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{setup, venv, worker_bin, workspace_root};

/// Preloaded into the second mlx-lm process.
const OPENBLAS: &str = venv::DEBIAN_OPENBLAS;

#[derive(Debug, Deserialize)]
struct PromptsFile {
    max_new_tokens: u32,
    prompts: Vec<BenchPrompt>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BenchPrompt {
    pub name: String,
    pub messages: Vec<ChatMessage>,
    /// A chat's next turn: before each measured run the worker answers the conversation up to
    /// the last user message but one (unmeasured), so its prompt cache holds that turn, as in a
    /// chat; mlx-lm (`stream_generate`, as Studio's Python backend calls it) prefills it all.
    #[serde(default)]
    pub next_turn: bool,
    /// With `next_turn`: another chat takes a turn between the two (the prompt cache must keep
    /// both conversations to still hit). Made by the bench from each `next_turn` prompt.
    #[serde(skip)]
    pub after_another_chat: bool,
}

/// The other chat's message of an `after_another_chat` prompt.
const ANOTHER_CHAT: &str = "Write a haiku about autumn leaves.";

/// The release mlx-worker (over the protocol) beside mlx-lm, stock and with OpenBLAS preloaded,
/// on SmolLM2: prefill/decode tok/s, ttft, peak memory; medians and ratios.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Measured rounds; each side reports the median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,
    /// Tokens generated per run (default: xtask/bench/prompts.json's, or moe.json's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_new_tokens: Option<u32>,
    /// Only mlx-lm (to test this harness without the worker).
    #[arg(long)]
    pub(crate) skip_worker: bool,
    /// Leave out the mlx-lm + OpenBLAS column.
    #[arg(long = "no-openblas", action = clap::ArgAction::SetFalse)]
    pub(crate) openblas: bool,
    /// Instead: a vision model with one 800 px image beside mlx-vlm (`xtask/bench/vision.json`).
    #[arg(long)]
    vision: bool,
    /// Instead: the worker's decode with a JSON schema beside the same without one.
    #[arg(long)]
    constrained: bool,
    /// Instead: the worker rewriting a text with prompt lookup beside the same without it.
    #[arg(long)]
    speculative: bool,
    /// With --speculative: most draft tokens per pass.
    #[arg(long, default_value_t = 10)]
    num_draft_tokens: u32,
    /// With --speculative: also this model drafting (a directory), worker vs mlx-lm.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Instead: mixtures of experts and a hybrid (delta-net) model of wide random weights built
    /// by mlx-lm's classes (`xtask/bench/moe.json`), the same comparison.
    #[arg(long)]
    moe: bool,
    /// Instead: the late-2026 families (multi-head latent attention, ...) at wide random
    /// weights built by mlx-lm's classes (`xtask/bench/families.json`), the same comparison.
    #[arg(long)]
    families: bool,
    /// With --moe or --families: only this model of the file (repeatable).
    #[arg(long = "only", value_name = "NAME")]
    pub only: Vec<String>,
    /// Instead: time to first token of a ~4k-token conversation cold, warm from the prompt
    /// cache in memory, and warm from its disk tier after a restart (`--disk-cache-bytes`), on
    /// SmolLM2 and a hybrid (Qwen3-Next) fixture, beside mlx-lm's cold prefill of the same ids.
    #[arg(long)]
    cache: bool,
    /// Instead: aggregate decode tok/s with several chats at once (`xtask/bench/batch.json`),
    /// the worker (`--max-batch`) beside mlx-lm's `BatchGenerator`.
    #[arg(long)]
    batch: bool,
    /// With --batch: how many chats run at once, one measurement per width.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) widths: Vec<u32>,
    /// With --batch: the worker's `--batch-attention` (rows, padded; default: auto);
    /// several, comma-separated, run one worker each, side by side in the same rounds.
    #[arg(long, value_delimiter = ',')]
    pub(crate) batch_attention: Vec<String>,
    /// This mlx-worker binary instead of building the release one (an earlier build, to set its
    /// ratios beside this tree's on the same machine). With --batch it may be given more than
    /// once: each binary is a side of its own in the same rounds, named by its directory.
    #[arg(long, value_name = "PATH")]
    pub(crate) worker: Vec<PathBuf>,
}

impl Options {
    /// The first `--worker`, or the release worker built from this tree.
    pub(crate) fn worker_bin(&self) -> anyhow::Result<PathBuf> {
        match self.worker.first() {
            Some(bin) => Ok(bin.clone()),
            None => worker_bin::build_release(),
        }
    }

    /// Every `--worker`, or the release worker built from this tree.
    pub(crate) fn worker_bins(&self) -> anyhow::Result<Vec<PathBuf>> {
        match self.worker.is_empty() {
            true => Ok(vec![worker_bin::build_release()?]),
            false => Ok(self.worker.clone()),
        }
    }
}

/// One measured generation, from either side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub prompt_tokens: u64,
    pub generated: u64,
    pub prompt_tps: f64,
    pub decode_tps: f64,
    pub ttft_ms: f64,
    pub peak_bytes: u64,
}

/// Which sides run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Worker,
    MlxLm,
    MlxLmOpenBlas,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if opts.vision {
        return crate::bench_vision::run(opts.runs, opts.max_new_tokens, &opts.worker_bin()?);
    }
    if opts.batch {
        return crate::bench_batch::run(opts);
    }
    if opts.cache {
        return crate::bench_cache::run(opts);
    }
    let file = prompts()?;
    if opts.moe {
        return crate::bench_fixtures::run(opts, &file.prompts, "moe.json");
    }
    if opts.families {
        return crate::bench_fixtures::run(opts, &file.prompts, "families.json");
    }
    let max_new_tokens = opts.max_new_tokens.unwrap_or(file.max_new_tokens);
    let model = setup::default_model_dir()
        .context("the benchmark model is missing: run `cargo xtask setup`")?;
    if opts.constrained {
        let bin = opts.worker_bin()?;
        let prompt = &file.prompts[0];
        return crate::bench_constrained::run(&bin, &model, prompt, opts.runs, max_new_tokens);
    }
    if opts.speculative {
        return crate::bench_speculative::run(&crate::bench_speculative::Options {
            model: &model,
            story: &file.prompts[1],
            runs: opts.runs,
            drafts: opts.num_draft_tokens,
            draft_model: opts.draft_model.clone(),
            bin: opts.worker_bin()?,
        });
    }
    compare(
        opts,
        &model,
        "SmolLM2-135M-Instruct (float32)",
        &file.prompts,
        max_new_tokens,
    )
}

/// The worker, stock mlx-lm and (unless `--no-openblas`) mlx-lm + OpenBLAS on `model`: every
/// prompt once per round on each side, then one table per prompt.
pub(crate) fn compare(
    opts: &Options,
    model: &Path,
    title: &str,
    prompts: &[BenchPrompt],
    max_new_tokens: u32,
) -> anyhow::Result<()> {
    let python = venv::reference_python()?;

    let runtime = tokio::runtime::Runtime::new()?;
    let worker = if opts.skip_worker {
        None
    } else {
        let bin = opts.worker_bin()?;
        Some(runtime.block_on(Worker::start(&bin, model))?)
    };
    let mut stock = MlxLm::start(&python, model, None, None)?;
    let mut openblas = if opts.openblas {
        Some(MlxLm::start_openblas(&python, BENCH_SCRIPT, &[model])?)
    } else {
        None
    };

    let mut sides: Vec<Side> = Vec::new();
    if worker.is_some() {
        sides.push(Side::Worker);
    }
    sides.push(Side::MlxLm);
    if openblas.is_some() {
        sides.push(Side::MlxLmOpenBlas);
    }

    let mut measure = |side: Side, prompt: &BenchPrompt, max: u32| -> anyhow::Result<Sample> {
        match side {
            Side::Worker => {
                runtime.block_on(worker.as_ref().expect("worker side").generate(prompt, max))
            }
            Side::MlxLm => stock.generate(prompt, max),
            Side::MlxLmOpenBlas => openblas
                .as_mut()
                .expect("openblas side")
                .generate(prompt, max),
        }
    };

    // Warm-up: the first generation of a process pays for one-off setup on every side.
    eprintln!("bench: warm-up");
    for &side in &sides {
        measure(side, &prompts[0], 8)?;
    }

    // samples[prompt][side] = one sample per round.
    let mut samples = vec![vec![Vec::new(); sides.len()]; prompts.len()];
    for round in 1..=opts.runs {
        eprintln!("bench: round {round}/{}", opts.runs);
        for (p, prompt) in prompts.iter().enumerate() {
            for (s, &side) in sides.iter().enumerate() {
                samples[p][s].push(measure(side, prompt, max_new_tokens)?);
            }
        }
    }

    let loaded = |bytes: u64| format!("{:.1} MB", bytes as f64 / 1e6);
    let mut after_load = vec![format!("mlx-lm {}", loaded(stock.loaded_bytes))];
    if let Some(w) = &worker {
        after_load.insert(0, format!("worker {}", loaded(w.loaded_bytes)));
    }
    if let Some(o) = &openblas {
        after_load.push(format!("mlx-lm+OpenBLAS {}", loaded(o.loaded_bytes)));
    }
    if let Some(w) = worker {
        runtime.block_on(w.client.shutdown()).ok();
    }
    drop(stock);
    drop(openblas);

    println!();
    println!(
        "{title}, greedy, {max_new_tokens} new tokens, median of {} runs; \
         ratio = worker advantage (worker/mlx-lm for tok/s, mlx-lm/worker for ms and bytes)",
        opts.runs
    );
    println!(
        "MLX active memory after load (the weights): {}",
        after_load.join(", ")
    );
    for (p, prompt) in prompts.iter().enumerate() {
        print_table(prompt, &sides, &samples[p], max_new_tokens);
    }
    Ok(())
}

/// `xtask/bench/prompts.json`.
/// `prompts.json`, each `next_turn` prompt followed by its `after_another_chat` variant.
fn prompts() -> anyhow::Result<PromptsFile> {
    let mut file = prompts_file()?;
    let variants: Vec<BenchPrompt> = (file.prompts.iter())
        .filter(|p| p.next_turn)
        .map(|p| BenchPrompt {
            name: format!("{} after another chat", p.name),
            after_another_chat: true,
            ..p.clone()
        })
        .collect();
    file.prompts.extend(variants);
    Ok(file)
}

fn prompts_file() -> anyhow::Result<PromptsFile> {
    let path = workspace_root().join("xtask/bench/prompts.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid prompts file", path.display()))
}

fn print_table(prompt: &BenchPrompt, sides: &[Side], samples: &[Vec<Sample>], max: u32) {
    let col = |side: Side| sides.iter().position(|&s| s == side).map(|i| &samples[i]);
    let (w, m, o) = (
        col(Side::Worker),
        col(Side::MlxLm),
        col(Side::MlxLmOpenBlas),
    );
    let first = &samples[0][0];
    println!();
    println!(
        "prompt `{}`: {} prompt tokens{}",
        prompt.name,
        m.or(o).map_or(first.prompt_tokens, |v| v[0].prompt_tokens),
        if prompt.next_turn {
            " (a chat's next turn: the worker prefills only what its prompt cache lacks, so \
             its prefill tok/s counts those tokens; compare ttft)"
        } else {
            ""
        }
    );
    println!("| metric | worker | mlx-lm | ratio | mlx-lm+OpenBLAS | ratio |");
    println!("|---|---|---|---|---|---|");
    type Get = fn(&Sample) -> f64;
    let rows: [(&str, Get, bool, usize); 4] = [
        ("prefill tok/s", |s| s.prompt_tps, true, 1),
        ("decode tok/s", |s| s.decode_tps, true, 2),
        ("ttft ms", |s| s.ttft_ms, false, 0),
        ("peak memory MB", |s| s.peak_bytes as f64 / 1e6, false, 0),
    ];
    for (name, get, higher_is_better, digits) in rows {
        let med = |v: Option<&Vec<Sample>>| v.map(|v| median(v.iter().map(get).collect()));
        let (wv, mv, ov) = (med(w), med(m), med(o));
        let ratio = |other: Option<f64>| match (wv, other) {
            (Some(a), Some(b)) if a > 0.0 && b > 0.0 => {
                format!("{:.2}x", if higher_is_better { a / b } else { b / a })
            }
            _ => "-".into(),
        };
        let fmt = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"));
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            fmt(wv),
            fmt(mv),
            ratio(mv),
            fmt(ov),
            ratio(ov)
        );
    }
    // The decode rate only means something if every run generated the full budget.
    let generated: Vec<String> = sides
        .iter()
        .zip(samples)
        .map(|(side, v)| {
            let name = match side {
                Side::Worker => "worker",
                Side::MlxLm => "mlx-lm",
                Side::MlxLmOpenBlas => "mlx-lm+OpenBLAS",
            };
            let min = v.iter().map(|s| s.generated).min().unwrap_or(0);
            let max_seen = v.iter().map(|s| s.generated).max().unwrap_or(0);
            format!("{name} {min}..{max_seen}")
        })
        .collect();
    let short = samples
        .iter()
        .flatten()
        .any(|s| s.generated < u64::from(max));
    println!(
        "generated tokens per run: {}{}",
        generated.join(", "),
        if short {
            " (WARNING: some runs stopped before max_new_tokens)"
        } else {
            ""
        }
    );
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The release worker over the protocol, with the model loaded.
pub(crate) struct Worker {
    pub client: Client,
    /// MLX's active memory right after the load: the weights as held.
    pub loaded_bytes: u64,
    /// `initialize`'s result.
    pub initialized: Value,
}

impl Worker {
    pub async fn start(bin: &Path, model: &Path) -> anyhow::Result<Self> {
        Self::start_with(bin, &LoadParams::new(model.display().to_string())).await
    }

    /// The worker with `load` done.
    pub async fn start_with(bin: &Path, load: &LoadParams) -> anyhow::Result<Self> {
        Self::start_args(bin, &[], load).await
    }

    /// The worker started with `args`, with `load` done.
    pub async fn start_args(
        bin: &Path,
        args: &[String],
        load: &LoadParams,
    ) -> anyhow::Result<Self> {
        Self::start_env(bin, args, &[], load).await
    }

    /// [`Worker::start_args`] with `env` added to the worker's environment.
    pub async fn start_env(
        bin: &Path,
        args: &[String],
        env: &[(&str, &Path)],
        load: &LoadParams,
    ) -> anyhow::Result<Self> {
        let mut envs = vec![("MLX_WORKER_LOG", OsStr::new("warn"))];
        envs.extend(env.iter().map(|&(k, v)| (k, v.as_os_str())));
        let client = Client::spawn(bin, args, envs)
            .with_context(|| format!("starting {}", bin.display()))?;
        let initialized = client
            .request_value(
                "initialize",
                json!({"client": {"name": "xtask-bench", "version": env!("CARGO_PKG_VERSION")}}),
            )
            .await
            .with_context(|| {
                format!(
                    "worker: initialize, started with {args:?} (stderr: {})",
                    client.stderr_tail()
                )
            })?;
        client
            .request::<_, Value>("load", load)
            .await
            .with_context(|| {
                format!(
                    "worker: loading {} (stderr: {})",
                    load.model,
                    client.stderr_tail()
                )
            })?;
        let status = client
            .call::<protocol::methods::Status>(&StatusParams::default())
            .await
            .context("worker: status")?;
        Ok(Self {
            client,
            loaded_bytes: status.memory.active_bytes,
            initialized,
        })
    }

    /// `params` generated from an empty prompt cache.
    pub async fn fresh_generate(&self, params: &GenerateParams) -> anyhow::Result<GenerateResult> {
        self.client
            .call::<protocol::methods::Reset>(&protocol::methods::ResetParams::default())
            .await
            .context("worker: reset")?;
        let result = self.client.generate(params)?.finish().await;
        result.context("worker: generate")
    }

    pub async fn generate(&self, prompt: &BenchPrompt, max: u32) -> anyhow::Result<Sample> {
        self.generate_with(prompt, max, |_| {}).await
    }

    /// [`Worker::generate`] with `edit` applied to the measured request's params.
    pub async fn generate_with(
        &self,
        prompt: &BenchPrompt,
        max: u32,
        edit: impl FnOnce(&mut GenerateParams),
    ) -> anyhow::Result<Sample> {
        // Every run starts from an empty prompt cache, which would otherwise hold all but the
        // last token of the same prompt from the run before.
        self.client
            .call::<protocol::methods::Reset>(&protocol::methods::ResetParams::default())
            .await
            .context("worker: reset")?;
        if prompt.next_turn {
            let earlier = &prompt.messages[..prompt.messages.len().saturating_sub(2)];
            let mut params = GenerateParams::new(earlier.to_vec());
            params.max_new_tokens = max;
            params.sampling.temperature = 0.0;
            self.client
                .generate(&params)?
                .finish()
                .await
                .context("worker: the turn before")?;
        }
        if prompt.after_another_chat {
            let mut params = GenerateParams::new(vec![ChatMessage::new("user", ANOTHER_CHAT)]);
            params.max_new_tokens = max;
            params.sampling.temperature = 0.0;
            let other = self.client.generate(&params)?.finish().await;
            other.context("worker: another chat's turn")?;
        }
        let mut params = GenerateParams::new(prompt.messages.clone());
        params.max_new_tokens = max;
        params.sampling.temperature = 0.0;
        edit(&mut params);
        let result = self
            .client
            .generate(&params)?
            .finish()
            .await
            .context("worker: generate")?;
        let status = self
            .client
            .call::<protocol::methods::Status>(&StatusParams::default())
            .await
            .context("worker: status")?;
        let t = &result.timings;
        Ok(Sample {
            prompt_tokens: t.prompt_n,
            generated: t.predicted_n,
            prompt_tps: t.prompt_per_second,
            decode_tps: t.predicted_per_second,
            ttft_ms: t.ttft_ms,
            peak_bytes: status.memory.peak_bytes,
        })
    }
}

/// `cargo xtask bench`'s mlx-lm side, in `xtask/bench/`.
const BENCH_SCRIPT: &str = "mlx_lm_bench.py";

/// A long-lived mlx-lm process (`mlx_lm_bench.py`, or another script of `xtask/bench/` that
/// answers one JSON line per request line after a ready line) with the model loaded.
pub(crate) struct MlxLm {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The script's file name, for errors.
    script: &'static str,
    /// BLAS libraries the process has mapped.
    blas: Vec<String>,
    /// MLX's active memory right after the load.
    loaded_bytes: u64,
}

impl MlxLm {
    /// mlx-lm with `model` loaded (and `draft`, for speculative decoding).
    pub fn start(
        python: &Path,
        model: &Path,
        draft: Option<&Path>,
        preload: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut args = vec![model];
        args.extend(draft);
        Self::start_script(python, BENCH_SCRIPT, &args, preload)
    }

    /// `xtask/bench/<script>` with Debian's OpenBLAS preloaded, checked to have taken effect.
    pub fn start_openblas(
        python: &Path,
        script: &'static str,
        args: &[&Path],
    ) -> anyhow::Result<Self> {
        if !Path::new(OPENBLAS).is_file() {
            bail!(
                "{OPENBLAS} is missing: install Debian's libopenblas0-pthread, or pass \
                 --no-openblas"
            );
        }
        let p = Self::start_script(python, script, args, Some(OPENBLAS))?;
        if !p.blas.iter().any(|l| l.starts_with("libopenblas")) {
            bail!(
                "the OpenBLAS preload did not take effect (mapped BLAS: {:?})",
                p.blas
            );
        }
        Ok(p)
    }

    /// `xtask/bench/<script> <args>`, after its ready line.
    pub fn start_script(
        python: &Path,
        script: &'static str,
        args: &[&Path],
        preload: Option<&str>,
    ) -> anyhow::Result<Self> {
        let path: PathBuf = workspace_root().join("xtask/bench").join(script);
        let mut cmd = Command::new(python);
        cmd.arg(&path)
            .args(args)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(lib) = preload {
            cmd.env("LD_PRELOAD", lib);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), path.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut me = Self {
            child,
            stdin,
            stdout,
            script,
            blas: Vec::new(),
            loaded_bytes: 0,
        };
        let ready = me.read_answer()?;
        me.blas = serde_json::from_value(ready["blas"].clone()).unwrap_or_default();
        me.loaded_bytes = ready["active_memory_bytes"].as_u64().unwrap_or(0);
        Ok(me)
    }

    fn read_answer(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .with_context(|| format!("reading from {}", self.script))?;
        if line.is_empty() {
            bail!("{} exited early; see its output above", self.script);
        }
        serde_json::from_str(&line).with_context(|| format!("{} printed {line:?}", self.script))
    }

    /// One measured generation: the script's answer to `request`.
    pub fn request(&mut self, request: &Value) -> anyhow::Result<Value> {
        writeln!(self.stdin, "{request}").with_context(|| format!("writing to {}", self.script))?;
        self.read_answer()
    }

    fn generate(&mut self, prompt: &BenchPrompt, max: u32) -> anyhow::Result<Sample> {
        let a = self.request(&json!({"messages": prompt.messages, "max_new_tokens": max}))?;
        let num = |k: &str| {
            a[k].as_f64()
                .with_context(|| format!("mlx_lm_bench.py: no {k} in {a}"))
        };
        Ok(Sample {
            prompt_tokens: num("prompt_tokens")? as u64,
            generated: num("generation_tokens")? as u64,
            prompt_tps: num("prompt_tps")?,
            decode_tps: num("generation_tps")?,
            ttft_ms: num("ttft_ms")?,
            peak_bytes: num("peak_memory_bytes")? as u64,
        })
    }
}

impl Drop for MlxLm {
    fn drop(&mut self) {
        // Closing stdin ends its read loop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
