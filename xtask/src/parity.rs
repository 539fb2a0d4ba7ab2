//! `cargo xtask parity`: greedy generation token for token against mlx-lm on the same MLX build.
//!
//! The cases (chat prompts), the models and the tiny random-weight fixtures are described in
//! `xtask/parity/cases.json`. `xtask/parity/make_fixtures.py` builds the fixtures with mlx-lm's
//! own Llama class into `<target>/parity-fixtures/`; `xtask/parity/reference.py` gives mlx-lm's
//! prompt ids (Hugging Face chat template) and greedy tokens. This side loads the same
//! directories with `mlx_engine::Engine`, renders the same messages with our template, generates
//! greedily, and compares both the prompt ids and the generated ids exactly.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use mlx_engine::{
    prompt_ids, text, CancelToken, Engine, GenerateRequest, LoadRequest, Prompt, SamplerParams,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{setup, venv, workspace_root};

const USAGE: &str = "\
usage: cargo xtask parity [--model NAME]... [--max-new-tokens N] [--cases FILE]

  --model NAME        only this model of the cases file (repeatable)
  --max-new-tokens N  override the cases file's token budget
  --cases FILE        another cases file (default xtask/parity/cases.json)
";

#[derive(Debug, Deserialize)]
struct CasesFile {
    max_new_tokens: usize,
    cases: Vec<Case>,
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

#[derive(Debug, Deserialize)]
struct Reference {
    /// The BLAS libraries mapped into mlx-lm's process.
    blas: Vec<String>,
    cases: Vec<ReferenceCase>,
}

#[derive(Debug, Deserialize)]
struct ReferenceCase {
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

struct Options {
    models: Vec<String>,
    max_new_tokens: Option<usize>,
    cases: PathBuf,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut opts = Options {
        models: Vec::new(),
        max_new_tokens: None,
        cases: workspace_root().join("xtask/parity/cases.json"),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        match arg.as_str() {
            "--model" => opts.models.push(value("--model")?),
            "--max-new-tokens" => {
                let v = value("--max-new-tokens")?;
                opts.max_new_tokens = Some(
                    v.parse()
                        .with_context(|| format!("--max-new-tokens {v:?} is not a number"))?,
                );
            }
            "--cases" => opts.cases = PathBuf::from(value("--cases")?),
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(opts)
}

/// The cargo target directory (where fixtures go: generated, never committed).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_relative() {
                workspace_root().join(p)
            } else {
                p
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
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
        let status = Command::new(&python)
            .arg(workspace_root().join("xtask/parity/make_fixtures.py"))
            .arg(&opts.cases)
            .arg(&smollm2)
            .arg(&fixtures)
            .status()
            .with_context(|| format!("starting {}", python.display()))?;
        if !status.success() {
            bail!("make_fixtures.py failed ({status}); see its output above");
        }
    }

    let mut engine = Engine::new();
    let mut rows = Vec::new();
    for spec in selected {
        let dir = match (&spec.source, &spec.fixture) {
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
            file.cases.len()
        );
        let reference = reference(&python, spec, &dir, max_new_tokens, &file.cases)?;
        if cfg!(target_os = "linux") && !reference.blas.iter().any(|b| b.contains("openblas")) {
            bail!(
                "mlx-lm did not load {} (its BLAS: {:?})",
                venv::DEBIAN_OPENBLAS,
                reference.blas
            );
        }
        rows.extend(compare(
            &mut engine,
            spec,
            &dir,
            max_new_tokens,
            &file.cases,
            &reference,
        )?);
        engine.unload(None).ok();
    }

    print_table(&rows);
    let failed = rows.iter().filter(|r| !r.ok()).count();
    if failed > 0 {
        bail!(
            "parity: {failed} of {} cases differ from mlx-lm",
            rows.len()
        );
    }
    println!(
        "parity: all {} cases match mlx-lm token for token",
        rows.len()
    );
    Ok(())
}

/// A fixture's LoRA adapter (`<dir>/adapter/`, written when its spec has one).
fn adapter_of(dir: &Path) -> Option<PathBuf> {
    Some(dir.join("adapter")).filter(|a| a.is_dir())
}

/// mlx-lm's prompt ids and greedy tokens for every case.
fn reference(
    python: &Path,
    spec: &ModelSpec,
    dir: &Path,
    max_new_tokens: usize,
    cases: &[Case],
) -> anyhow::Result<Reference> {
    let request = json!({
        "model_dir": dir,
        "adapter_dir": adapter_of(dir),
        "kv_bits": spec.kv_bits,
        "chat_template": spec.chat_template,
        "max_new_tokens": max_new_tokens,
        "cases": cases,
    });
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
    let mut child = command
        .arg(workspace_root().join("xtask/parity/reference.py"))
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(request.to_string().as_bytes())
        .context("writing to reference.py")?;
    let out = child
        .wait_with_output()
        .context("waiting for reference.py")?;
    if !out.status.success() {
        bail!(
            "reference.py failed on {} ({}); see its output above",
            dir.display(),
            out.status
        );
    }
    let reference: Reference =
        serde_json::from_slice(&out.stdout).context("reference.py printed no valid JSON")?;
    if reference.cases.len() != cases.len() {
        bail!(
            "reference.py answered {} cases, expected {}",
            reference.cases.len(),
            cases.len()
        );
    }
    Ok(reference)
}

/// Loads `dir` in the engine, runs every case greedily and compares with the reference.
fn compare(
    engine: &mut Engine,
    spec: &ModelSpec,
    dir: &Path,
    max_new_tokens: usize,
    cases: &[Case],
    reference: &Reference,
) -> anyhow::Result<Vec<Row>> {
    let loaded = engine
        .load(
            &LoadRequest {
                model: dir.display().to_string(),
                adapter: adapter_of(dir).map(|a| a.display().to_string()),
                kv_bits: spec.kv_bits,
                chat_template_override: spec.chat_template.clone(),
                ..Default::default()
            },
            &mut |_| {},
            &CancelToken::new(),
        )
        .with_context(|| format!("engine: loading {}", dir.display()))?;
    let mut rows = Vec::new();
    for (case, want) in cases.iter().zip(&reference.cases) {
        debug_assert_eq!(case.name, want.name);
        let messages: Vec<text::Message> =
            serde_json::from_value(Value::Array(case.messages.clone()))
                .with_context(|| format!("case {:?}: messages", case.name))?;
        let prompt = Prompt::Chat {
            messages,
            options: text::RenderOptions::default(),
        };
        let ids = prompt_ids(&loaded.tokenizer, &prompt)
            .with_context(|| format!("case {:?}: rendering the prompt", case.name))?;
        let req = GenerateRequest {
            model: None,
            prompt,
            max_new_tokens,
            sampler: SamplerParams {
                temperature: 0.0,
                ..Default::default()
            },
            stop: Vec::new(),
            logprobs: 0,
            use_adapter: None,
        };
        // mlx-lm starts every case from empty caches; so does this side (no prompt cache reuse:
        // tests/worker_prompt_cache.rs covers that).
        engine.reset();
        let got = engine
            .generate(&req, &mut |_| {}, &CancelToken::new())
            .with_context(|| format!("engine: generating case {:?}", case.name))?;
        let first_divergence = first_difference(&want.tokens, &got.token_ids);
        let row = Row {
            model: spec.name.clone(),
            case: case.name.clone(),
            prompt_len: (want.prompt_ids.len(), ids.len()),
            prompt_equal: want.prompt_ids == ids,
            generated_len: (want.tokens.len(), got.token_ids.len()),
            first_divergence,
        };
        if !row.prompt_equal {
            let at = first_difference(&want.prompt_ids, &ids).unwrap_or(0);
            eprintln!(
                "  {}/{}: prompt ids differ at {at}: mlx-lm {:?} vs ours {:?}",
                spec.name,
                case.name,
                window(&want.prompt_ids, at),
                window(&ids, at)
            );
        }
        if let Some(at) = first_divergence {
            eprintln!(
                "  {}/{}: generated ids differ at {at}: mlx-lm {:?} vs ours {:?}",
                spec.name,
                case.name,
                window(&want.tokens, at),
                window(&got.token_ids, at)
            );
        }
        rows.push(row);
    }
    Ok(rows)
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
        "| model | case | prompt tokens (mlx-lm/ours) | prompt equal | generated (mlx-lm/ours) | generated equal | first divergence |"
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
