//! The release `mlx-worker` binary, built on demand for the demo and the benchmark.

use std::{path::PathBuf, process::Command};

use anyhow::{ensure, Context};

use crate::workspace_root;

/// Builds `target/release/mlx-worker` (a no-op when it is current) and returns its path.
pub fn build_release() -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "mlx-worker"])
        .current_dir(&root)
        .status()
        .context("running cargo build")?;
    ensure!(
        status.success(),
        "cargo build --release -p mlx-worker failed"
    );
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(target.join("release/mlx-worker"))
}
