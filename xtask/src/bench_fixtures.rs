//! `cargo xtask bench --moe` and `--families`: the comparison of `cargo xtask bench` (the release
//! worker over the protocol beside mlx-lm, stock and with OpenBLAS) on wide random-weight models
//! built by mlx-lm's own classes (written by `make_fixtures.py` into
//! `<target>/parity-fixtures/`), each loaded once per side: sparse mixtures of experts and a
//! hybrid model (`xtask/bench/moe.json`), the late-2026 families (`xtask/bench/families.json`).
//! The prompts are `prompts.json`'s single-turn ones.

use anyhow::Context;
use serde::Deserialize;

use crate::bench::{compare, BenchPrompt, Options};
use crate::{parity, workspace_root};

#[derive(Debug, Deserialize)]
struct FixturesFile {
    max_new_tokens: u32,
    models: Vec<Model>,
}

#[derive(Debug, Deserialize)]
struct Model {
    name: String,
    /// What the table's title says the model is.
    title: String,
}

/// The comparison on every model of `xtask/bench/<file>`.
pub fn run(opts: &Options, prompts: &[BenchPrompt], file: &str) -> anyhow::Result<()> {
    let path = workspace_root().join("xtask/bench").join(file);
    let file: FixturesFile = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a valid bench file", path.display()))?;
    let max = opts.max_new_tokens.unwrap_or(file.max_new_tokens);
    let prompts: Vec<BenchPrompt> = prompts.iter().filter(|p| !p.next_turn).cloned().collect();
    if let Some(name) = (opts.only.iter()).find(|n| !file.models.iter().any(|m| &m.name == *n)) {
        let names: Vec<&str> = file.models.iter().map(|m| m.name.as_str()).collect();
        anyhow::bail!(
            "--only {name:?} is not in {}; it has: {}",
            path.display(),
            names.join(", ")
        );
    }
    let fixtures = parity::make_fixtures(&path)?;
    let chosen = |m: &&Model| opts.only.is_empty() || opts.only.contains(&m.name);
    for model in file.models.iter().filter(chosen) {
        eprintln!("bench: {}", model.name);
        compare(
            opts,
            &fixtures.join(&model.name),
            &model.title,
            &prompts,
            max,
        )?;
    }
    Ok(())
}
