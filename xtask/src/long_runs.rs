//! End-to-end tests that CI runs short, run long in release (the real worker binary over real
//! pipes):
//! - `cargo xtask fuzz --lines N`: the dispatcher fuzzer (`tests/fuzz/`) for `N` lines, split over
//!   `--runs` seeds from `--seed` on. Reproduce a failure with the seed it prints:
//!   `cargo xtask fuzz --lines <its lines> --seed <its seed>`.
//! - `cargo xtask soak --generations N`: `tests/soak.rs` for `N` generations; prints the drifts.

use std::process::Command;
use std::time::Instant;

use crate::{cargo, run_checked};

/// `cargo test --release` of the end-to-end tests matching `filter`, output shown.
fn release_test(filter: &str) -> Command {
    let mut command = cargo();
    command
        .args(["test", "--release", "-p", "mlx-worker", "--test", "tests"])
        .args([filter, "--", "--nocapture"]);
    command
}

#[derive(clap::Args)]
pub struct SoakOptions {
    /// Generations after warm-up.
    #[arg(long, default_value_t = 1000)]
    generations: u64,
}

pub fn soak(opts: &SoakOptions) -> anyhow::Result<()> {
    run_checked(
        release_test("soak::").env("SOAK_GENERATIONS", opts.generations.to_string()),
        "the soak",
    )
}

#[derive(clap::Args)]
pub struct FuzzOptions {
    /// Lines to send in all.
    #[arg(long, default_value_t = 100_000)]
    lines: u64,
    /// The first run's seed (decimal or 0x-hex); run k uses seed + k.
    #[arg(long, default_value = "0x5eedf022", value_parser = parse_seed)]
    seed: u64,
    /// Runs (fresh workers) the lines are split over.
    #[arg(long, default_value_t = 1)]
    runs: u64,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s}: {e}"))
}

pub fn fuzz(opts: &FuzzOptions) -> anyhow::Result<()> {
    let runs = opts.runs.max(1);
    let started = Instant::now();
    for k in 0..runs {
        let lines = opts.lines / runs + u64::from(k < opts.lines % runs);
        let seed = opts.seed.wrapping_add(k);
        eprintln!("fuzz: run {}/{runs}: {lines} lines, seed {seed:#x}", k + 1);
        run_checked(
            release_test("fuzz::")
                .env("FUZZ_ITERS", lines.to_string())
                .env("FUZZ_SEED", format!("{seed:#x}")),
            "the dispatcher fuzzer",
        )?;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: {} lines over {runs} runs clean in {secs:.0} s ({:.0} lines/s)",
        opts.lines,
        opts.lines as f64 / secs
    );
    Ok(())
}
