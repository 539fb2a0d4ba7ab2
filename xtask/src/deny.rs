//! `cargo xtask deny`: cargo-deny's license, ban and source checks of the dependency tree
//! (`deny.toml`), part of `cargo xtask test`. Advisories are left out: their database is on
//! GitHub, out of the build machines' reach.

use crate::{run_checked, tools::cargo_tool, workspace_root};

const CARGO_DENY: &str = "0.20.2";

pub fn run() -> anyhow::Result<()> {
    let deny = cargo_tool("cargo-deny", CARGO_DENY)?;
    eprintln!("test: cargo deny check licenses bans sources");
    run_checked(
        std::process::Command::new(deny)
            .args(["check", "licenses", "bans", "sources"])
            .current_dir(workspace_root()),
        "cargo deny",
    )
}
