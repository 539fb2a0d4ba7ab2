//! Cargo tools xtask needs (cargo-zigbuild, cargo-deny), installed once per target directory under
//! `<target>/xtask-tools`, at pinned versions.

use std::path::PathBuf;

use crate::{cargo, run_checked, target_dir};

/// The binary `name` of crate `name` at `version`, installed with `cargo install --locked` if it
/// is not there yet.
pub fn cargo_tool(name: &str, version: &str) -> anyhow::Result<PathBuf> {
    let root = target_dir().join("xtask-tools");
    let bin = root.join("bin").join(name);
    if !bin.is_file() {
        eprintln!("xtask: cargo install {name}@{version}");
        run_checked(
            cargo()
                .args(["install", "--locked", "--version", version, name, "--root"])
                .arg(&root),
            &format!("cargo install {name}"),
        )?;
    }
    Ok(bin)
}
