//! `cargo xtask pytest`, the last step of `cargo xtask test`: the Python package's tests
//! (`protocol/python`). `pip install` of the package into the venv (proving it installs with
//! nothing but PyPI), then pytest against the real worker binary, the real SmolLM2 and Gemma 3
//! 270M, and the tiny LoRA fixture of `cargo xtask parity`.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::bail;

use crate::{parity, run_checked, setup, target_dir, venv, worker_bin, workspace_root};

/// `built`: the worker binary `cargo test` just built (`cargo xtask test`); `None` builds it.
/// `MLX_WORKER_BIN`, when set, names another build to test instead (e.g. the release one).
pub fn run(built: Option<PathBuf>) -> anyhow::Result<()> {
    let models = [
        ("MLX_WORKER_SMOLLM2_DIR", setup::default_model_dir()?),
        ("MLX_WORKER_GEMMA3_DIR", setup::gemma3_270m_dir()?),
    ];
    let python = venv::reference_python()?;
    let package = workspace_root().join("protocol/python");
    eprintln!("test: pip install {}", package.display());
    venv::pip_install(
        &python,
        [
            OsStr::new("--no-deps"),
            OsStr::new("--force-reinstall"),
            package.as_os_str(),
        ],
    )?;
    let worker = match (std::env::var_os("MLX_WORKER_BIN"), built) {
        (Some(path), _) => PathBuf::from(path),
        (None, Some(path)) => path,
        (None, None) => worker_bin::build_debug()?,
    };
    let tiny_lora = target_dir().join("parity-fixtures/tiny-lora");
    if !tiny_lora.join("adapter/adapter_config.json").is_file() {
        eprintln!("test: writing the tiny LoRA fixture (parity of tiny-lora)");
        parity::run(&parity::Options {
            models: vec!["tiny-lora".into()],
            ..parity::Options::default()
        })?;
    }
    if !tiny_lora.join("adapter/adapter_config.json").is_file() {
        bail!("no tiny LoRA fixture at {}", tiny_lora.display());
    }
    eprintln!("test: pytest protocol/python/tests ({})", worker.display());
    run_checked(
        Command::new(&python)
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--durations=5",
            ])
            .arg(package.join("tests"))
            .current_dir(&package)
            .env("MLX_WORKER_BIN", &worker)
            .env("MLX_WORKER_TINY_LORA_DIR", &tiny_lora)
            .env(
                "MLX_WORKER_VISION_FIXTURES",
                parity::make_vision_fixtures(&parity::Options::default().cases)?,
            )
            .envs(models.iter().map(|(k, v)| (*k, v.as_os_str()))),
        "pytest protocol/python/tests",
    )
}
