//! `cargo xtask check-macos`: what can be proved here, on Linux, about the Mac build.
//!
//! 1. Feature resolution for `aarch64-apple-darwin`: mlx-rs (and so mlx-sys) with `metal`.
//! 2. `cargo check --target aarch64-apple-darwin -p mlx-worker`: the whole worker, mlx-rs's
//!    Metal API included, type-checks for the Mac, against bindings generated for the target
//!    from mlx-c, with the `mlx-metal` wheel fetched, sha256-checked and its layout verified by
//!    mlx-sys's build script. C dependencies (ring, oniguruma) need a C compiler for macOS:
//!    cargo-zigbuild supplies zig's, with macOS's C headers (zig from PyPI's `ziglang`).
//!
//! Linking and running need a Mac; the wheel's Mach-O facts (install name, dependencies) are
//! checked by `crates/pypi/tests/mlx_wheels.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context};

use crate::{cargo, run_checked, target_dir, venv};

const TARGET: &str = "aarch64-apple-darwin";
const CARGO_ZIGBUILD: &str = "0.24.1";
const ZIGLANG: &str = "ziglang==0.17.1";

pub fn run() -> anyhow::Result<()> {
    eprintln!("check-macos: rustup target add {TARGET}");
    run_checked(
        Command::new("rustup").args(["target", "add", TARGET]),
        "rustup target add (the Mac's standard library, from rustup's servers)",
    )?;

    eprintln!("check-macos: feature resolution for {TARGET}");
    let tree = cargo()
        .args([
            "tree",
            "-e",
            "features",
            "--target",
            TARGET,
            "-p",
            "mlx-worker",
            "-i",
            "mlx-sys",
        ])
        .output()
        .context("running cargo tree")?;
    ensure!(
        tree.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let tree = String::from_utf8_lossy(&tree.stdout);
    metal_resolved(&tree)?;

    let tools = tools()?;
    eprintln!("check-macos: cargo check --target {TARGET} -p mlx-worker (zig as the C compiler)");
    let path = std::env::join_paths(
        [tools.zig_bin.clone(), tools.cargo_bin.clone()]
            .into_iter()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )),
    )?;
    run_checked(
        Command::new(tools.cargo_bin.join("cargo-zigbuild"))
            .args(["check", "--target", TARGET, "-p", "mlx-worker", "--tests"])
            // zig names its header directories relative to the current directory when they lie
            // below it (the venv is in the workspace root), and bindgen runs in mlx-sys's
            // directory: from a directory that is no ancestor of the venv, the paths are absolute.
            .current_dir(crate::workspace_root().join("crates/worker"))
            // Its own target directory: zig's compiler settings change the fingerprints of
            // host build scripts, which would otherwise rebuild the main debug tree each time.
            .env("CARGO_TARGET_DIR", target_dir().join("check-macos"))
            .env("PATH", path),
        "cargo-zigbuild check",
    )?;
    eprintln!("check-macos: ok (Metal resolved; the worker checks for {TARGET})");
    Ok(())
}

/// Both halves of "Metal on": mlx-rs's Metal API and mlx-sys's feature, each pulled in by the
/// engine for this target.
fn metal_resolved(tree: &str) -> anyhow::Result<()> {
    for wanted in ["mlx-rs feature \"metal\"", "mlx-sys feature \"metal\""] {
        ensure!(
            tree.contains(wanted),
            "for {TARGET}, cargo resolves no {wanted}: the Mac build would run MLX without \
             Metal's API. `cargo tree -e features --target {TARGET} -p mlx-worker -i mlx-sys` says:\n{tree}"
        );
    }
    Ok(())
}

struct Tools {
    cargo_bin: PathBuf,
    zig_bin: PathBuf,
}

/// cargo-zigbuild (crates.io) under `<target>/xtask-tools`, and zig (PyPI's `ziglang`) in the
/// reference venv; cargo-zigbuild finds zig through `python3 -m ziglang`.
fn tools() -> anyhow::Result<Tools> {
    let zigbuild = crate::tools::cargo_tool("cargo-zigbuild", CARGO_ZIGBUILD)?;
    let cargo_bin = zigbuild
        .parent()
        .context("a tool has a directory")?
        .to_path_buf();
    let python = venv::reference_python()?;
    let zig_bin = python
        .parent()
        .map(Path::to_path_buf)
        .context("venv python has no directory")?;
    if !Command::new(&python)
        .args(["-c", "import ziglang"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("check-macos: pip install {ZIGLANG}");
        run_checked(
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                ZIGLANG,
            ]),
            "pip install ziglang",
        )?;
    }
    Ok(Tools { cargo_bin, zig_bin })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_without_metal_is_refused() {
        let without = "mlx-sys v0.7.0\n└── mlx-rs feature \"safetensors\"\n";
        assert!(metal_resolved(without).is_err());
        let with = "├── mlx-rs feature \"metal\"\n└── mlx-sys feature \"metal\"\n";
        assert!(metal_resolved(with).is_ok());
    }
}
