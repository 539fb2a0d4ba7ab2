//! The reference Python: mlx-lm and mlx-vlm in a venv at `<workspace>/.venv` (git-ignored),
//! with pytest for the Python package's tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::run_checked as run;

/// Exactly these, so the reference runs the MLX build the worker links; pytest runs the Python
/// package's tests (`protocol/python`, which itself needs nothing beyond the standard library).
const REQUIREMENTS: [&str; 10] = [
    "mlx==0.32.4",
    "mlx-cpu==0.32.4",
    "mlx-lm==0.32.2",
    "pytest==9.2.0",
    // The vision reference's image stack: resampling and processor outputs are compared bit
    // for bit, and Pillow's resize changed between versions (docs/traps.md).
    "pillow==13.0.0",
    "numpy==2.4.6",
    "transformers==5.24.0",
    "requests==2.34.2",
    // mlx-vlm itself, installed without its dependencies (NO_DEPS).
    "mlx-vlm==0.7.0",
    // llama.cpp's Python library, which writes the GGUF parity fixtures (its own dependencies,
    // numpy, pyyaml, requests and tqdm, come with the packages above).
    "gguf==0.19.0",
];
/// Of REQUIREMENTS, installed with `--no-deps`: mlx-vlm declares a web server, audio and
/// OpenCV stacks that neither its model classes nor its processors import; what they do import
/// is listed above.
const NO_DEPS: [&str; 2] = ["mlx-vlm==0.7.0", "gguf==0.19.0"];
/// Written after a successful install; holds the requirement list it installed.
const MARKER: &str = "mlx-worker-requirements.txt";

/// The venv's python, creating the venv and installing the reference packages if needed.
pub fn reference_python() -> anyhow::Result<PathBuf> {
    ensure(
        &crate::workspace_root().join(".venv"),
        &REQUIREMENTS,
        &NO_DEPS,
    )
}

/// The python of the venv at `venv` holding exactly `requirements` (those in `no_deps` installed
/// without their dependencies), made or completed when its marker lists something else.
pub fn ensure(venv: &Path, requirements: &[&str], no_deps: &[&str]) -> anyhow::Result<PathBuf> {
    let python = venv.join("bin").join("python");
    let marker = venv.join(MARKER);
    let wanted = requirements.join("\n") + "\n";
    if python.is_file() && std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str())
    {
        return Ok(python);
    }
    if !python.is_file() {
        eprintln!("creating {}", venv.display());
        run(
            Command::new("python3").arg("-m").arg("venv").arg(venv),
            "python3 -m venv",
        )?;
    }
    eprintln!(
        "installing {} into {}",
        requirements.join(" "),
        venv.display()
    );
    let (without, rest): (Vec<&str>, Vec<&str>) =
        requirements.iter().partition(|r| no_deps.contains(r));
    pip_install(&python, rest)?;
    if !without.is_empty() {
        pip_install(&python, ["--no-deps"].into_iter().chain(without))?;
    }
    std::fs::write(&marker, wanted).with_context(|| format!("writing {}", marker.display()))?;
    Ok(python)
}

/// `python -m pip install --quiet <args>`, with its output shown on failure.
pub fn pip_install<S: AsRef<std::ffi::OsStr>>(
    python: &std::path::Path,
    args: impl IntoIterator<Item = S>,
) -> anyhow::Result<()> {
    run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args),
        "pip install",
    )
}

/// Whether this machine's BLAS (the worker's OpenBLAS) gives a row of a product at SmolLM2's
/// shapes the bits it gets alone, up to 8 rows (`xtask/parity/blas_rows.py`).
pub fn blas_keeps_row_bits() -> anyhow::Result<bool> {
    let python = reference_python()?;
    let out = Command::new(&python)
        .arg(crate::workspace_root().join("xtask/parity/blas_rows.py"))
        .env("LD_PRELOAD", DEBIAN_OPENBLAS)
        .output()
        .context("running xtask/parity/blas_rows.py")?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || said.is_empty() {
        anyhow::bail!(
            "blas_rows.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("test: this machine's BLAS keeps a row's bits: {said}");
    Ok(said == "exact")
}

/// Debian's OpenBLAS (package libopenblas0-pthread): the BLAS the worker links on Linux
/// (crates/mlx-sys), preloaded into mlx-lm where its numbers are compared with ours.
pub const DEBIAN_OPENBLAS: &str = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0";
