//! The release `mlx-worker` binary, built on demand for the demo and the benchmark.

use std::path::PathBuf;

use crate::{cargo, run_checked, target_dir};

/// Builds `target/release/mlx-worker` (a no-op when it is current; cargo's progress shows, the
/// first build compiles MLX's C API) and returns its path.
pub fn build_release() -> anyhow::Result<PathBuf> {
    eprintln!("building the release mlx-worker (the first build compiles mlx-c: minutes)");
    run_checked(
        cargo().args(["build", "--release", "-p", "mlx-worker"]),
        "cargo build --release -p mlx-worker",
    )?;
    Ok(target_dir().join("release/mlx-worker"))
}
