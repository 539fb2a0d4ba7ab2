//! The `mlx-worker` binary, built on demand: release for the demo and the benchmark, the test
//! profile's (what `cargo test` builds) for the Python package's tests.

use std::path::PathBuf;

use crate::{cargo, run_checked, target_dir};

/// Builds `target/release/mlx-worker` (a no-op when it is current; cargo's progress shows, the
/// first build compiles MLX's C API) and returns its path.
pub fn build_release() -> anyhow::Result<PathBuf> {
    eprintln!("building the release mlx-worker (the first build compiles mlx-c: minutes)");
    build(&["--release"], "release")
}

/// Builds `target/debug/mlx-worker`, the binary `cargo test` runs (a no-op after it), and
/// returns its path.
pub fn build_debug() -> anyhow::Result<PathBuf> {
    build(&[], "debug")
}

fn build(args: &[&str], profile_dir: &str) -> anyhow::Result<PathBuf> {
    run_checked(
        cargo().args(["build", "-p", "mlx-worker"]).args(args),
        &format!("cargo build -p mlx-worker {}", args.join(" ")),
    )?;
    Ok(target_dir().join(profile_dir).join("mlx-worker"))
}
