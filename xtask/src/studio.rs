//! `cargo xtask studio`: Unsloth Studio's own code on the release worker. The package's wheel
//! (`cargo xtask wheel`: the worker inside) is built and checked; a venv at
//! `target/studio/venv` holds Studio 2026.10.9 (the PyPI package `unsloth`, installed without its
//! dependencies: no torch, no GPU package), the few light packages its worker child and
//! orchestrator import on these paths, and the wheel (with `mlx-cpu`, which it requires); Studio's
//! `studio/backend` is copied to `target/studio/backend` and `studio/studio-2026.10.9.patch`
//! applied to it (what a Studio maintainer applies; its size is printed). Then
//! `studio/scenarios.py` drives Studio's inference child and `InferenceOrchestrator` through
//! every scenario and prints the table (docs/studio.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::{parity, run_checked, setup, target_dir, venv, wheel, worker_bin, workspace_root};

/// Studio's release, as Studio users install it.
const STUDIO: &str = "unsloth==2026.10.9";
/// What Studio's code imports on the scenarios' paths, pinned (found by running it: the worker
/// child needs structlog, pyyaml, filelock and huggingface-hub; the orchestrator httpx,
/// fastapi, pyjwt; the load route's own settings comparison python-multipart and cryptography;
/// images pillow).
const REQUIREMENTS: [&str; 10] = [
    "structlog==26.1.0",
    "pyyaml==6.0.4",
    "filelock==4.3.2",
    "httpx==0.29.0",
    "fastapi==0.141.1",
    "huggingface-hub==1.33.0",
    "pyjwt==2.15.1",
    "python-multipart==0.0.34",
    "cryptography==51.0.1",
    "pillow==13.0.0",
];

pub fn run(built: Option<PathBuf>) -> anyhow::Result<()> {
    let worker = match built {
        Some(path) => path,
        None => worker_bin::build_release()?,
    };
    let root = target_dir().join("studio");
    // The package as users install it: the wheel with the worker inside, beside MLX's own.
    let wheel = wheel::build(&worker)?;
    wheel::check(&wheel)?;
    let python = studio_venv(&root.join("venv"))?;
    eprintln!("studio: pip install {}", wheel.display());
    venv::pip_install(&python, ["--force-reinstall".as_ref(), wheel.as_os_str()])?;
    let backend = patched_backend(&python, &root)?;

    let cases = parity::Options::default().cases;
    let fixtures = parity::make_fixtures(&cases)?;
    let (tiny_gpt_oss, tiny_qwen3_5) =
        (fixtures.join("tiny-gpt-oss"), fixtures.join("tiny-qwen3-5"));
    let tiny_lora = target_dir().join("parity-fixtures/tiny-lora");
    if !tiny_lora.join("adapter/adapter_config.json").is_file() {
        parity::run(&parity::Options {
            models: vec!["tiny-lora".into()],
            ..parity::Options::default()
        })?;
    }
    let vision = parity::make_vision_fixtures(&cases)?.join("tiny-gemma3-vl");
    let home = root.join("home");
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home)?;
    let site = workspace_root().join("studio/site");
    let pythonpath = std::env::join_paths([site.as_path(), backend.as_path()])?;
    eprintln!("studio: scenarios through Studio's worker child and orchestrator");
    run_checked(
        Command::new(&python)
            .arg(workspace_root().join("studio/scenarios.py"))
            .current_dir(&root)
            // Studio writes ~/.unsloth; the Hub is never asked (local models only).
            .env("HOME", &home)
            .env("HF_HUB_OFFLINE", "1")
            .env("PYTHONPATH", pythonpath)
            // The worker is the one the wheel installed: no MLX_WORKER_BIN, nothing on PATH.
            .env_remove("MLX_WORKER_BIN")
            .env("MLX_WORKER_SMOLLM2_DIR", setup::default_model_dir()?)
            .env("MLX_WORKER_GEMMA3_DIR", setup::gemma3_270m_dir()?)
            .env("MLX_WORKER_TINY_LORA_DIR", &tiny_lora)
            .env("MLX_WORKER_VISION_MODEL", &vision)
            .env("MLX_WORKER_TINY_GPT_OSS", &tiny_gpt_oss)
            .env("MLX_WORKER_TINY_QWEN3_5", &tiny_qwen3_5),
        "studio/scenarios.py",
    )
}

/// The venv with Studio (without its dependencies) and its light imports, made once.
fn studio_venv(venv: &Path) -> anyhow::Result<PathBuf> {
    let requirements: Vec<&str> = REQUIREMENTS.iter().copied().chain([STUDIO]).collect();
    venv::ensure(venv, &requirements, &[STUDIO])
}

/// A fresh copy of the installed Studio's `studio/backend` with the patch applied.
fn patched_backend(python: &Path, root: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import studio, os; print(os.path.join(os.path.dirname(studio.__file__), 'backend'))",
        ])
        .output()
        .context("asking the venv where Studio is")?;
    if !out.status.success() {
        bail!("Studio's package is not importable in {}", python.display());
    }
    let installed = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    let backend = root.join("backend");
    let _ = std::fs::remove_dir_all(&backend);
    run_checked(
        Command::new("cp").arg("-r").arg(&installed).arg(&backend),
        "copying Studio's backend",
    )?;
    let patch = workspace_root().join("studio/studio-2026.10.9.patch");
    run_checked(
        Command::new("patch")
            .args(["-p1", "--forward", "--quiet", "-d"])
            .arg(&backend)
            .arg("-i")
            .arg(&patch),
        "patch -p1 (studio/studio-2026.10.9.patch)",
    )?;
    let text = std::fs::read_to_string(&patch)?;
    let changed = |sign: char| {
        text.lines()
            .filter(|l| l.starts_with(sign) && !l.starts_with("+++") && !l.starts_with("---"))
            .count()
    };
    eprintln!(
        "studio: the patch changes Studio in {} line(s) (-{} +{}): {}",
        changed('-').max(changed('+')),
        changed('-'),
        changed('+'),
        patch.display()
    );
    Ok(backend)
}
