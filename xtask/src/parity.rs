//! `cargo xtask parity`: greedy generation token for token against mlx-lm on the same MLX build.
//!
//! The cases (chat prompts), the models and the tiny random-weight fixtures are described in
//! `xtask/parity/cases.json`. `xtask/parity/make_fixtures.py` builds the fixtures with mlx-lm's
//! own Llama class into `<target>/parity-fixtures/`; `xtask/parity/reference.py` gives mlx-lm's
//! prompt ids (Hugging Face chat template) and greedy tokens. Our side is the engine's `parity`
//! example (`crates/engine/examples/parity.rs`, built by cargo in the test profile, where
//! `cargo test` has built MLX already): it reads the same request and answers in the same
//! shape, and xtask compares the prompt ids and the generated ids exactly.
//!
//! A fixture spec with "gguf" also gets `<name>.gguf` (`xtask/parity/gguf_fixture.py`, the
//! checkpoint as llama.cpp's converter writes it, float32): the worker imports and runs that,
//! mlx-lm the original checkpoint.
//!
//! Vision-language models (a "vision" spec) are compared with mlx-vlm the same way, on the
//! file's `vision_cases` (messages with image parts): `make_vision_fixtures.py` builds them with
//! mlx-vlm's classes (and the case images), `vision_reference.py` answers for mlx-vlm.

use std::collections::{hash_map::Entry, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{cargo, run_checked, setup, target_dir, venv, workspace_root};

#[derive(Debug, Deserialize)]
struct CasesFile {
    max_new_tokens: usize,
    cases: Vec<Case>,
    /// Cases for vision models: image parts name files of the fixtures' `images/`.
    #[serde(default)]
    vision_cases: Vec<Case>,
    models: Vec<ModelSpec>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
struct Case {
    name: String,
    messages: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct ModelSpec {
    name: String,
    /// `"default"`: the SmolLM2 directory from `cargo xtask setup`.
    #[serde(default)]
    source: Option<String>,
    /// A fixture spec for make_fixtures.py.
    #[serde(default)]
    fixture: Option<Value>,
    /// A vision-language fixture spec for make_vision_fixtures.py (compared with mlx-vlm).
    #[serde(default)]
    vision: Option<Value>,
    /// Overrides the file's `max_new_tokens` for this model.
    #[serde(default)]
    max_new_tokens: Option<usize>,
    /// Quantize the KV cache to this many bits (both sides; mlx-lm from the first token).
    #[serde(default)]
    kv_bits: Option<u8>,
    /// A chat template for both sides (models without one, e.g. base models).
    #[serde(default)]
    chat_template: Option<String>,
}

/// What either side answers.
#[derive(Debug, Deserialize)]
struct Answer {
    /// mlx-lm only: the BLAS libraries mapped into its process.
    #[serde(default)]
    blas: Vec<String>,
    #[serde(default)]
    cases: Vec<AnswerCase>,
    /// Ours, split over ranks: why this model cannot be split so.
    #[serde(default)]
    refused: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AnswerCase {
    name: String,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
}

/// One compared case.
struct Row {
    model: String,
    case: String,
    prompt_len: (usize, usize),
    prompt_equal: bool,
    generated_len: (usize, usize),
    first_divergence: Option<usize>,
}

impl Row {
    fn ok(&self) -> bool {
        self.prompt_equal && self.first_divergence.is_none()
    }
}

/// Greedy tokens and prompt ids, case for case, against mlx-lm on the same MLX build.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Only this model of the cases file (repeatable).
    #[arg(long = "model", value_name = "NAME")]
    pub(crate) models: Vec<String>,
    /// Override the cases file's token budget.
    #[arg(long)]
    pub(crate) max_new_tokens: Option<usize>,
    /// Another cases file.
    #[arg(long, default_value_os_t = workspace_root().join("xtask/parity/cases.json"))]
    pub(crate) cases: PathBuf,
    /// Run our side as a group of this many ranks over MLX's ring backend on loopback.
    #[arg(long, default_value_t = 1)]
    pub(crate) ranks: usize,
    /// With --ranks: split each text model by "pipeline" or "tensor" parallel (vision models
    /// and models that cannot be split so are listed, not compared).
    #[arg(long, value_parser = ["pipeline", "tensor"])]
    pub(crate) parallel: Option<String>,
}

impl Default for Options {
    /// Every model and case of `xtask/parity/cases.json`.
    fn default() -> Self {
        Options {
            models: Vec::new(),
            max_new_tokens: None,
            cases: workspace_root().join("xtask/parity/cases.json"),
            ranks: 1,
            parallel: None,
        }
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&opts.cases)
        .with_context(|| format!("reading {}", opts.cases.display()))?;
    let file: CasesFile = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid cases file", opts.cases.display()))?;
    for m in &opts.models {
        if !file.models.iter().any(|s| &s.name == m) {
            bail!(
                "--model {m:?} is not in {}; it has: {}",
                opts.cases.display(),
                file.models
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let selected: Vec<&ModelSpec> = file
        .models
        .iter()
        .filter(|s| opts.models.is_empty() || opts.models.contains(&s.name))
        .collect();

    let smollm2 = setup::default_model_dir().context(
        "the SmolLM2 model (and its tokenizer, which the fixtures use) is missing: run `cargo xtask setup`",
    )?;
    let python = venv::reference_python()?;
    let fixtures = target_dir().join("parity-fixtures");
    if selected.iter().any(|s| s.fixture.is_some()) {
        make_fixtures(&opts.cases)?;
    }
    if selected.iter().any(|s| s.vision.is_some()) {
        make_vision_fixtures(&opts.cases)?;
    }
    let vision_cases = with_image_paths(&file.vision_cases, &fixtures.join("images"));

    let engine = engine_example()?;
    // One reference process per script for the whole run (Python and mlx-lm start once).
    let mut references = HashMap::new();
    let mut rows = Vec::new();
    let mut not_split = Vec::new();
    for spec in selected {
        if opts.ranks > 1 && spec.vision.is_some() {
            not_split.push((spec.name.clone(), "a vision model".to_owned()));
            continue;
        }
        let (cases, script) = match spec.vision {
            Some(_) => (&vision_cases, "vision_reference.py"),
            None => (&file.cases, "reference.py"),
        };
        let dir = match (&spec.source, &spec.fixture) {
            _ if spec.vision.is_some() => fixtures.join(&spec.name),
            (Some(s), None) if s == "default" => smollm2.clone(),
            (Some(s), None) if s == "gemma3-270m" => setup::gemma3_270m_dir()
                .context("Gemma 3 270M is missing: run `cargo xtask setup`")?,
            (None, Some(_)) => fixtures.join(&spec.name),
            _ => bail!(
                "model {:?}: give either \"source\" (\"default\" or \"gemma3-270m\") or a \"fixture\" spec",
                spec.name
            ),
        };
        let max_new_tokens = opts
            .max_new_tokens
            .or(spec.max_new_tokens)
            .unwrap_or(file.max_new_tokens);
        eprintln!(
            "parity: {} ({} cases, {max_new_tokens} new tokens)",
            spec.name,
            cases.len()
        );
        let request = json!({
            "model_dir": dir,
            "adapter_dir": adapter_of(&dir),
            "kv_bits": spec.kv_bits,
            "chat_template": spec.chat_template,
            "max_new_tokens": max_new_tokens,
            "cases": cases,
        });
        // A fixture with a "gguf" spec: the worker loads (imports) its `.gguf`, mlx-lm the
        // checkpoint it was written from.
        let mut ours_request = request.clone();
        if spec.fixture.as_ref().and_then(|f| f.get("gguf")).is_some() {
            ours_request["model_dir"] = json!(dir.join(format!("{}.gguf", spec.name)));
        }
        ours_request["parallel"] = json!(opts.parallel);
        let started = Instant::now();
        let (reference, ours) = match (opts.parallel.as_deref(), opts.ranks) {
            // One process a side: both at once. Most fixtures are tiny, so each side keeps
            // about one core busy; side by side, the run takes about half as long on two.
            (_, 1) => {
                let reference = match references.entry(script) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => e.insert(Reference::start(&python, script)?),
                };
                reference.send(&request)?;
                let ours = Side::start(&mut Command::new(&engine), &ours_request)?;
                (
                    reference.receive(&dir, cases.len())?,
                    ours.finish(&dir, cases.len())?,
                )
            }
            // Against mlx-lm's own tensor parallelism where its model has it (`shard`);
            // else against one process.
            (Some("tensor"), ranks) => {
                let mut split = request.clone();
                split["parallel"] = json!("tensor");
                reference_command(&python, script)?;
                let command = |_: usize| reference_command(&python, script).expect("checked");
                let reference = match answer_as_group(command, ranks, &split, &dir, cases.len()) {
                    Ok(answer) => answer,
                    Err(e) => {
                        println!("reference for {}: mlx-lm in one process ({e:#})", spec.name);
                        reference(&python, script, &request, &dir, cases.len())?
                    }
                };
                let command = |_: usize| Command::new(&engine);
                let ours = answer_as_group(command, ranks, &ours_request, &dir, cases.len())?;
                (reference, ours)
            }
            (_, ranks) => {
                let reference = reference(&python, script, &request, &dir, cases.len())?;
                let command = |_: usize| Command::new(&engine);
                let ours = answer_as_group(command, ranks, &ours_request, &dir, cases.len())?;
                (reference, ours)
            }
        };
        eprintln!(
            "parity: {}: {:.1} s",
            spec.name,
            started.elapsed().as_secs_f64()
        );
        if cfg!(target_os = "linux") && !reference.blas.iter().any(|b| b.contains("openblas")) {
            bail!(
                "mlx-lm did not load {} (its BLAS: {:?})",
                venv::DEBIAN_OPENBLAS,
                reference.blas
            );
        }
        if let Some(reason) = ours.refused {
            not_split.push((spec.name.clone(), reason));
            continue;
        }
        rows.extend(compare(spec, cases, &reference, &ours));
    }

    print_table(&rows);
    for (model, reason) in &not_split {
        println!("not split: {model}: {reason}");
    }
    let failed = rows.iter().filter(|r| !r.ok()).count();
    if failed > 0 {
        bail!(
            "parity: {failed} of {} cases differ from the reference (mlx-lm; mlx-vlm for vision models)",
            rows.len()
        );
    }
    println!(
        "parity: all {} cases match the reference (mlx-lm; mlx-vlm for vision models) token for token",
        rows.len()
    );
    Ok(())
}

/// Builds the text fixtures of `cases` with mlx-lm's classes into `<target>/parity-fixtures/`
/// (some tests read them too, e.g. the engine's `hybrid`); returns that directory.
/// Current ones are left alone.
pub fn make_fixtures(cases: &Path) -> anyhow::Result<PathBuf> {
    let python = venv::reference_python()?;
    let smollm2 = setup::default_model_dir().context(
        "the SmolLM2 model (and its tokenizer, which the fixtures use) is missing: run `cargo xtask setup`",
    )?;
    let fixtures = target_dir().join("parity-fixtures");
    run_checked(
        Command::new(&python)
            .arg(workspace_root().join("xtask/parity/make_fixtures.py"))
            .arg(cases)
            .arg(&smollm2)
            .arg(&fixtures),
        "make_fixtures.py",
    )?;
    Ok(fixtures)
}

/// Builds the vision-language fixtures of `cases` (and their images) with mlx-vlm's classes
/// into `<target>/parity-fixtures/`; returns that directory. Current ones are left alone.
pub fn make_vision_fixtures(cases: &Path) -> anyhow::Result<PathBuf> {
    let python = venv::reference_python()?;
    let gemma3 = setup::gemma3_270m_dir().context(
        "Gemma 3 270M (whose tokenizer the Gemma 3 vision fixtures use) is missing: run `cargo xtask setup`",
    )?;
    let smollm2 = setup::default_model_dir().context(
        "SmolLM2 (whose tokenizer the LLaVA fixtures use) is missing: run `cargo xtask setup`",
    )?;
    let fixtures = target_dir().join("parity-fixtures");
    run_checked(
        Command::new(&python)
            .arg(workspace_root().join("xtask/parity/make_vision_fixtures.py"))
            .arg(cases)
            .arg(&gemma3)
            .arg(&fixtures)
            .arg(&smollm2),
        "make_vision_fixtures.py",
    )?;
    Ok(fixtures)
}

/// A fixture's LoRA adapter (`<dir>/adapter/`, written when its spec has one).
fn adapter_of(dir: &Path) -> Option<PathBuf> {
    Some(dir.join("adapter")).filter(|a| a.is_dir())
}

/// The engine's parity example, built (a no-op when current) in the profile `cargo test` uses.
fn engine_example() -> anyhow::Result<PathBuf> {
    eprintln!("parity: building the engine's parity example");
    run_checked(
        // --workspace: the features `cargo test --workspace` resolves, so its build is reused.
        cargo().args(["build", "--workspace", "--example", "parity"]),
        "cargo build --example parity",
    )?;
    Ok(target_dir().join("debug/examples/parity"))
}

/// `cases` with each image part's file name made a path into `images`.
fn with_image_paths(cases: &[Case], images: &Path) -> Vec<Case> {
    let mut cases = cases.to_vec();
    let parts = cases
        .iter_mut()
        .flat_map(|c| c.messages.iter_mut())
        .filter_map(|m| m.get_mut("content")?.as_array_mut())
        .flatten();
    for part in parts {
        if let Some(name) = part.get("image").and_then(Value::as_str) {
            part["image"] = json!(images.join(name));
        }
    }
    cases
}

/// The reference's (mlx-lm's, or mlx-vlm's with `vision_reference.py`) prompt ids and greedy
/// tokens for every case.
fn reference(
    python: &Path,
    script: &str,
    request: &Value,
    dir: &Path,
    cases: usize,
) -> anyhow::Result<Answer> {
    answer(&mut reference_command(python, script)?, request, dir, cases)
}

/// The reference's command: `script` under the venv's Python, with the worker's BLAS.
fn reference_command(python: &Path, script: &str) -> anyhow::Result<Command> {
    let mut command = Command::new(python);
    // The worker computes with Debian's OpenBLAS; MLX's wheel bundles another BLAS, whose
    // matmuls round differently (enough to flip a KV-cache quantization level now and then).
    // The same BLAS on both sides makes the comparison bit for bit.
    if cfg!(target_os = "linux") {
        if !Path::new(venv::DEBIAN_OPENBLAS).is_file() {
            bail!(
                "{} is missing: install libopenblas0-pthread (the worker links it too)",
                venv::DEBIAN_OPENBLAS
            );
        }
        command.env("LD_PRELOAD", venv::DEBIAN_OPENBLAS);
    }
    command
        .arg(workspace_root().join("xtask/parity").join(script))
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    Ok(command)
}

/// Our side as a group of `ranks` on loopback (`cargo xtask launch`'s hostfile): every rank
/// reads `request`; rank 0 answers.
fn answer_as_group(
    command: impl Fn(usize) -> Command,
    ranks: usize,
    request: &Value,
    dir: &Path,
    cases: usize,
) -> anyhow::Result<Answer> {
    let hostfile = target_dir().join(format!("parity-hosts-{}.json", std::process::id()));
    std::fs::write(&hostfile, crate::launch::hosts(ranks)?)?;
    let rank = |r: usize| {
        let mut c = command(r);
        c.env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile);
        c
    };
    let mut followers = Vec::new();
    for r in 1..ranks {
        let mut child = rank(r)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting a rank")?;
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(request.to_string().as_bytes())?;
        followers.push(child);
    }
    let answer = answer(&mut rank(0), request, dir, cases);
    crate::launch::stop(&mut followers);
    let _ = std::fs::remove_file(&hostfile);
    answer
}

/// Runs one side with `request` on stdin and reads its answer from stdout.
fn answer(
    command: &mut Command,
    request: &Value,
    dir: &Path,
    cases: usize,
) -> anyhow::Result<Answer> {
    Side::start(command, request)?.finish(dir, cases)
}

/// One side, started with its request on stdin.
struct Side {
    /// Taken by [`Side::finish`]; a side dropped unfinished (the other side failed) is killed.
    child: Option<Child>,
    what: String,
}

impl Side {
    fn start(command: &mut Command, request: &Value) -> anyhow::Result<Side> {
        let what = format!("{:?}", command.get_program());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let side = Side {
            child: Some(child),
            what,
        };
        // Both sides read their whole request before they answer: no deadlock.
        let written = stdin.write_all(request.to_string().as_bytes());
        drop(stdin); // the end of the request
        written.with_context(|| format!("writing to {}", side.what))?;
        Ok(side)
    }

    /// Waits for its answer to the `cases` cases of the model at `dir`.
    fn finish(mut self, dir: &Path, cases: usize) -> anyhow::Result<Answer> {
        let what = self.what.clone();
        let out = (self.child.take().expect("finished once"))
            .wait_with_output()
            .with_context(|| format!("waiting for {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} failed on {} ({}); see its output above",
                dir.display(),
                out.status
            );
        }
        checked(&out.stdout, &what, cases)
    }
}

/// A reference process answering one request per line (`reference.py`, `vision_reference.py`),
/// kept for every model of a run.
struct Reference {
    child: Child,
    /// Closed (taken) when the run is over: the process then ends.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    what: String,
    /// A request was sent and its answer not read.
    pending: bool,
}

impl Reference {
    fn start(python: &Path, script: &str) -> anyhow::Result<Reference> {
        let what = format!("{script} under {}", python.display());
        let mut child = reference_command(python, script)?
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Reference {
            child,
            stdin,
            stdout,
            what,
            pending: false,
        })
    }

    fn send(&mut self, request: &Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().expect("open until dropped");
        self.pending = true;
        writeln!(stdin, "{request}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("writing to {}", self.what))
    }

    /// The answer to the last request sent, for the `cases` cases of the model at `dir`.
    fn receive(&mut self, dir: &Path, cases: usize) -> anyhow::Result<Answer> {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        self.pending = false;
        if read.is_err() || line.is_empty() {
            let status = self.child.wait();
            bail!(
                "{} ended on {} ({status:?}); see its output above",
                self.what,
                dir.display()
            );
        }
        checked(line.as_bytes(), &self.what, cases)
    }
}

impl Drop for Reference {
    /// Closing its input ends it between requests; one still answering is killed (its
    /// answer could fill the pipe nobody reads).
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.pending {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A side's answer from its output, which must hold `cases` cases (or a refusal).
fn checked(output: &[u8], what: &str, cases: usize) -> anyhow::Result<Answer> {
    let answer: Answer = serde_json::from_slice(output)
        .with_context(|| format!("{what} printed no valid answer"))?;
    if answer.cases.len() != cases && answer.refused.is_none() {
        bail!(
            "{what} answered {} cases, expected {cases}",
            answer.cases.len()
        );
    }
    Ok(answer)
}

/// Case for case: prompt ids and generated ids, each side's.
fn compare(spec: &ModelSpec, cases: &[Case], want: &Answer, got: &Answer) -> Vec<Row> {
    let mut rows = Vec::new();
    for ((case, want), got) in cases.iter().zip(&want.cases).zip(&got.cases) {
        debug_assert!(case.name == want.name && case.name == got.name);
        let first_divergence = first_difference(&want.tokens, &got.tokens);
        let row = Row {
            model: spec.name.clone(),
            case: case.name.clone(),
            prompt_len: (want.prompt_ids.len(), got.prompt_ids.len()),
            prompt_equal: want.prompt_ids == got.prompt_ids,
            generated_len: (want.tokens.len(), got.tokens.len()),
            first_divergence,
        };
        if !row.prompt_equal {
            let at = first_difference(&want.prompt_ids, &got.prompt_ids).unwrap_or(0);
            eprintln!(
                "  {}/{}: prompt ids differ at {at}: mlx-lm {:?} vs ours {:?}",
                spec.name,
                case.name,
                window(&want.prompt_ids, at),
                window(&got.prompt_ids, at)
            );
        }
        if let Some(at) = first_divergence {
            eprintln!(
                "  {}/{}: generated ids differ at {at}: mlx-lm {:?} vs ours {:?}",
                spec.name,
                case.name,
                window(&want.tokens, at),
                window(&got.tokens, at)
            );
        }
        rows.push(row);
    }
    rows
}

/// The first index where `a` and `b` differ (a length difference counts), `None` if equal.
fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

/// A few ids around `at`, for the mismatch report.
fn window(ids: &[u32], at: usize) -> &[u32] {
    &ids[at.saturating_sub(2).min(ids.len())..(at + 4).min(ids.len())]
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| model | case | prompt tokens (reference/ours) | prompt equal | generated (reference/ours) | generated equal | first divergence |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {}/{} | {} | {}/{} | {} | {} |",
            r.model,
            r.case,
            r.prompt_len.0,
            r.prompt_len.1,
            yes_no(r.prompt_equal),
            r.generated_len.0,
            r.generated_len.1,
            yes_no(r.first_divergence.is_none()),
            r.first_divergence
                .map_or_else(|| "-".to_owned(), |i| i.to_string()),
        );
    }
    println!();
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}
