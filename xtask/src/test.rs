//! `cargo xtask test`: the README's test command, and what CI runs. Provisions the real models
//! and the mlx-lm reference, runs every test of the workspace (failing, not skipping, when a
//! model is missing), then the parity check against mlx-lm.

use std::process::Command;

use anyhow::{ensure, Context};

use crate::{parity, setup, venv, workspace_root};

pub fn run() -> anyhow::Result<()> {
    let model = setup::default_model_dir()?;
    let gemma3_gguf = setup::gemma3_gguf()?;
    let gemma3 = setup::gemma3_270m_dir()?;
    venv::reference_python()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["test", "--workspace", "--no-fail-fast"])
        .current_dir(workspace_root())
        .env("MLX_WORKER_REQUIRE_MODELS", "1")
        .env("MLX_WORKER_SMOLLM2_DIR", &model)
        .env("MLX_WORKER_GEMMA3_GGUF", &gemma3_gguf)
        .env("MLX_WORKER_GEMMA3_DIR", &gemma3)
        .status()
        .context("running cargo test")?;
    ensure!(status.success(), "cargo test --workspace failed");
    parity::run(&[])
}
