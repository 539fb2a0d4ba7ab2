//! `cargo xtask families`: where the architectures come from. A table of every `model_type`
//! mlx-lm 0.32.2 loads (read from its own model directory by `xtask/families.py`): whether the
//! worker runs it (the release worker's `initialize`, `capabilities.architectures`: the engine's
//! lists, the one source `README.md`'s list is checked against), its parity fixtures and its
//! GGUF round trips (`xtask/parity/cases.json`). The worker's model types that mlx-lm does not
//! load (vision-language models, compared with mlx-vlm) follow.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use anyhow::Context;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{venv, worker_bin, workspace_root};

#[derive(Debug, Deserialize)]
struct ReferenceType {
    model_type: String,
    module: String,
}

pub fn run() -> anyhow::Result<()> {
    let python = venv::reference_python()?;
    let script = workspace_root().join("xtask/families.py");
    let out = Command::new(&python)
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "xtask/families.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference: Vec<ReferenceType> = serde_json::from_slice(&out.stdout)?;
    let runs = worker_architectures()?;
    let fixtures = fixtures_by_type()?;
    let none = Vec::new();
    let names = |list: &Vec<(String, bool)>, gguf: bool| -> String {
        let picked: Vec<&str> = list
            .iter()
            .filter(|(_, g)| *g == gguf)
            .map(|(n, _)| n.as_str())
            .collect();
        if picked.is_empty() {
            "-".to_owned()
        } else {
            picked.join(", ")
        }
    };
    println!("| model_type (mlx-lm 0.32.2) | mlx-lm module | worker | parity fixtures | GGUF round trips |");
    println!("|---|---|---|---|---|");
    let mut ran = 0;
    for t in &reference {
        let runs_it = runs.contains(&t.model_type);
        ran += usize::from(runs_it);
        let list = fixtures.get(&t.model_type).unwrap_or(&none);
        println!(
            "| {} | {} | {} | {} | {} |",
            t.model_type,
            t.module,
            if runs_it { "yes" } else { "no" },
            names(list, false),
            names(list, true),
        );
    }
    let known: BTreeSet<&str> = reference.iter().map(|t| t.model_type.as_str()).collect();
    let beyond: Vec<&String> = runs
        .iter()
        .filter(|a| !known.contains(a.as_str()))
        .collect();
    println!(
        "\n{ran} of mlx-lm's {} model types run on the worker.",
        reference.len()
    );
    if !beyond.is_empty() {
        println!("\nThe worker's model types that mlx-lm does not load (mlx-vlm's; parity with mlx-vlm):\n");
        println!("| model_type | parity fixtures |");
        println!("|---|---|");
        for a in beyond {
            let list = fixtures.get(a).unwrap_or(&none);
            println!("| {a} | {} |", names(list, false));
        }
    }
    Ok(())
}

/// `capabilities.architectures` of the release worker's `initialize`.
fn worker_architectures() -> anyhow::Result<BTreeSet<String>> {
    let bin = worker_bin::build_release()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client =
            protocol::Client::spawn(&bin, Vec::<String>::new(), [("MLX_WORKER_LOG", "warn")])
                .with_context(|| format!("starting {}", bin.display()))?;
        let init = client
            .request_value(
                "initialize",
                json!({"client": {"name": "xtask-families", "version": env!("CARGO_PKG_VERSION")}}),
            )
            .await?;
        let list = init["capabilities"]["architectures"]
            .as_array()
            .context("initialize answered without capabilities.architectures")?;
        Ok(list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect())
    })
}

/// Each model_type's parity fixtures in `xtask/parity/cases.json`, with whether it is a GGUF
/// round trip: a text fixture's `model_type` (default `llama`) and the `wrap` it sits in, a
/// vision fixture's `family`.
fn fixtures_by_type() -> anyhow::Result<BTreeMap<String, Vec<(String, bool)>>> {
    let path = workspace_root().join("xtask/parity/cases.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut by_type: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for model in cases["models"].as_array().into_iter().flatten() {
        let name = model["name"].as_str().unwrap_or("?").to_owned();
        let mut types = Vec::new();
        let fixture = &model["fixture"];
        if fixture.is_object() {
            types.push(fixture["model_type"].as_str().unwrap_or("llama"));
            types.extend(fixture["wrap"].as_str());
        }
        types.extend(model["vision"]["family"].as_str());
        let gguf = fixture.get("gguf").is_some();
        for t in types {
            by_type
                .entry(t.to_owned())
                .or_default()
                .push((name.clone(), gguf));
        }
    }
    Ok(by_type)
}
