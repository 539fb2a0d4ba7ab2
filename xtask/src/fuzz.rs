//! `cargo xtask fuzz --lines N`: the end-to-end dispatcher fuzzer (`tests/fuzz/`) for `N` lines,
//! in release (the real worker binary over real pipes, a tiny model resident), split over
//! `--runs` seeds from `--seed` on. Reproduce a failure with the seed it prints:
//! `cargo xtask fuzz --lines <its lines> --seed <its seed>`.

use std::time::Instant;

use crate::{cargo, run_checked};

#[derive(clap::Args)]
pub struct Options {
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

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let runs = opts.runs.max(1);
    let started = Instant::now();
    for k in 0..runs {
        let lines = opts.lines / runs + u64::from(k < opts.lines % runs);
        let seed = opts.seed.wrapping_add(k);
        eprintln!("fuzz: run {}/{runs}: {lines} lines, seed {seed:#x}", k + 1);
        run_checked(
            cargo()
                .args(["test", "--release", "-p", "mlx-worker", "--test", "tests"])
                .args(["fuzz::", "--", "--nocapture"])
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
