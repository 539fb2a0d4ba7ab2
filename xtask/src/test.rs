//! `cargo xtask test`: the README's test command, and what CI runs. Checks the dependency tree's
//! licenses and sources (cargo-deny), provisions the real models,
//! the vision fixtures and the mlx-lm / mlx-vlm reference, runs every test of the workspace
//! (failing, not skipping, when a model is missing), then the parity check against mlx-lm and
//! mlx-vlm, then the Python package's tests against the release worker.

use std::time::{Duration, Instant};

use crate::{
    cargo, check_macos, deny, parity, pytest, run_checked, setup, studio, venv, worker_bin,
};

pub fn run() -> anyhow::Result<()> {
    let mut steps = Steps::default();
    steps.run("deny", deny::run)?;
    let (model, gemma3_gguf, gemma3, vision) = steps.run("models, venv and fixtures", || {
        let model = setup::default_model_dir()?;
        let gemma3_gguf = setup::gemma3_gguf()?;
        let gemma3 = setup::gemma3_270m_dir()?;
        venv::reference_python()?;
        let cases = parity::Options::default().cases;
        // Tests read both kinds of fixtures from one directory (`fixtures::vision_fixture`).
        parity::make_fixtures(&cases)?;
        let vision = parity::make_vision_fixtures(&cases)?;
        Ok((model, gemma3_gguf, gemma3, vision))
    })?;
    // The batching tests compare rows bit for bit only where the BLAS keeps a row's bits.
    let rows_exact = venv::blas_keeps_row_bits()?;
    eprintln!("test: cargo test --workspace (real models required)");
    steps.run("cargo test --workspace", || {
        run_checked(
            cargo()
                .args(["test", "--workspace", "--no-fail-fast"])
                .env("MLX_WORKER_REQUIRE_MODELS", "1")
                .env("MLX_WORKER_SMOLLM2_DIR", &model)
                .env("MLX_WORKER_SMOLLM2_GGUF", setup::smollm2_gguf()?)
                .env("MLX_WORKER_GEMMA3_GGUF", &gemma3_gguf)
                .env("MLX_WORKER_GEMMA3_DIR", &gemma3)
                .env("MLX_WORKER_VISION_FIXTURES", &vision)
                .env(
                    "MLX_WORKER_BLAS_ROWS_EXACT",
                    if rows_exact { "1" } else { "0" },
                ),
            "cargo test --workspace",
        )
    })?;
    // On a Mac the native build above is the real thing; elsewhere, check the Mac's.
    if !cfg!(target_os = "macos") {
        steps.run("check-macos", check_macos::run)?;
    }
    eprintln!("test: parity against mlx-lm");
    steps.run("parity", || parity::run(&parity::Options::default()))?;
    // The Python package against the release worker, the binary Studio ships; then Studio's
    // own code on it.
    let release = steps.run("release build", worker_bin::build_release)?;
    steps.run("pytest", || pytest::run(Some(release.clone())))?;
    steps.run("studio", || studio::run(Some(release)))?;
    steps.report();
    Ok(())
}

/// How long each step took, printed at the end (where CI's time goes).
#[derive(Default)]
struct Steps(Vec<(&'static str, Duration)>);

impl Steps {
    fn run<T>(
        &mut self,
        name: &'static str,
        step: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let started = Instant::now();
        let result = step();
        self.0.push((name, started.elapsed()));
        if result.is_err() {
            self.report();
        }
        result
    }

    fn report(&self) {
        eprintln!("test: time per step");
        for (name, took) in &self.0 {
            eprintln!("  {name}: {:.0} s", took.as_secs_f64());
        }
    }
}
