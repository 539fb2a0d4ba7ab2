//! `cargo xtask wheel`: the Python package with the release worker inside it, as one platform
//! wheel (`target/wheels/mlx_worker-<version>-py3-none-<platform>.whl`), so that `pip install`
//! gives a client that finds its worker without `MLX_WORKER_BIN` or PATH.
//!
//! The binary goes to `mlx_worker/bin/mlx-worker` and uses the environment's MLX: its rpath
//! `$ORIGIN/../../mlx/lib` (`@loader_path/...` on macOS, .cargo/config.toml) is
//! `site-packages/mlx/lib`, where PyPI's `mlx-cpu` / `mlx-metal` wheel of the same release puts
//! `libmlx` (the wheel requires exactly that release). Why, and why not maturin:
//! docs/decisions/python-package.md. The wheel is written here (PEP 427: a zip with the package,
//! `METADATA`, `WHEEL` and a `RECORD` of sha256s) because the binary is the one cargo already
//! built and tested; a build backend would compile the worker again inside pip.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::{target_dir, workspace_root};

/// Builds the wheel around `worker` (a release `mlx-worker`) and returns its path.
pub fn build(worker: &Path) -> anyhow::Result<PathBuf> {
    let package = workspace_root().join("protocol/python");
    let version = project_version(&package.join("pyproject.toml"))?;
    let (platform, requires) = platform()?;
    let dist_info = format!("mlx_worker-{version}.dist-info");
    let mut files: Vec<(String, Vec<u8>, u32)> = Vec::new();
    let sources = package.join("src/mlx_worker");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&sources)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_file() && (name.ends_with(".py") || name == "py.typed") {
            files.push((format!("mlx_worker/{name}"), std::fs::read(&path)?, 0o644));
        }
    }
    let binary = std::fs::read(worker).with_context(|| format!("reading {}", worker.display()))?;
    files.push(("mlx_worker/bin/mlx-worker".into(), binary, 0o755));
    let metadata = format!(
        "Metadata-Version: 2.1\nName: mlx-worker\nVersion: {version}\n\
         Summary: Client for the mlx-worker binary (JSON-RPC over stdio), Unsloth Studio's MLX backend on it, and the binary\n\
         License: Apache-2.0\nRequires-Python: >=3.10\n{requires}",
        requires = requires.iter().map(|r| format!("Requires-Dist: {r}\n")).collect::<String>(),
    );
    files.push((
        format!("{dist_info}/METADATA"),
        metadata.into_bytes(),
        0o644,
    ));
    let wheel = format!(
        "Wheel-Version: 1.0\nGenerator: cargo-xtask-wheel\nRoot-Is-Purelib: false\nTag: py3-none-{platform}\n"
    );
    files.push((format!("{dist_info}/WHEEL"), wheel.into_bytes(), 0o644));
    let mut record = String::new();
    for (name, bytes, _) in &files {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
        record.push_str(&format!("{name},sha256={digest},{}\n", bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    files.push((format!("{dist_info}/RECORD"), record.into_bytes(), 0o644));

    let out = target_dir().join("wheels");
    std::fs::create_dir_all(&out)?;
    let path = out.join(format!("mlx_worker-{version}-py3-none-{platform}.whl"));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path)?);
    for (name, bytes, mode) in files {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(mode);
        zip.start_file(name, options)?;
        zip.write_all(&bytes)?;
    }
    zip.finish()?;
    eprintln!("wheel: {}", path.display());
    Ok(path)
}

/// Installs `wheel` into a fresh venv (`target/wheels/check-venv`) beside MLX's Python package
/// of the release it links, as Studio pins it (`mlx==<release>`): `pip check` must be clean and
/// the packaged worker must answer `initialize` with no `MLX_WORKER_BIN` and nothing on PATH.
pub fn check(wheel: &Path) -> anyhow::Result<()> {
    let venv = target_dir().join("wheels/check-venv");
    let _ = std::fs::remove_dir_all(&venv);
    crate::run_checked(
        std::process::Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv),
        "python3 -m venv",
    )?;
    let python = venv.join("bin/python");
    let mlx = format!("mlx=={}", pypi::mlx::MLX_VERSION);
    crate::venv::pip_install(&python, [std::ffi::OsStr::new(&mlx), wheel.as_os_str()])?;
    crate::run_checked(
        std::process::Command::new(&python).args(["-m", "pip", "check"]),
        "pip check",
    )?;
    let probe = "from mlx_worker import Client; c = Client(); \
                 print('packaged worker answers: mlx', c.initialize()['mlx']['version']); \
                 c.shutdown()";
    crate::run_checked(
        std::process::Command::new(&python)
            .args(["-c", probe])
            .env_remove("MLX_WORKER_BIN")
            .env("PATH", "/usr/bin:/bin"),
        "the packaged worker's initialize",
    )
}

/// The wheel's platform tag and the MLX wheel it needs, for the machine that builds it.
fn platform() -> anyhow::Result<(&'static str, Vec<String>)> {
    let mx = pypi::mlx::MLX_VERSION;
    if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        Ok(("linux_x86_64", vec![format!("mlx-cpu=={mx}")]))
    } else if cfg!(all(target_os = "linux", target_arch = "aarch64")) {
        Ok(("linux_aarch64", vec![format!("mlx-cpu=={mx}")]))
    } else if cfg!(all(target_os = "macos", target_arch = "aarch64")) {
        // The binary targets the Mac that built it (MACOSX_DEPLOYMENT_TARGET, README).
        Ok(("macosx_14_0_arm64", vec![format!("mlx-metal=={mx}")]))
    } else {
        bail!("no MLX wheel on PyPI for this platform")
    }
}

fn project_version(pyproject: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(pyproject)?;
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .with_context(|| format!("no version in {}", pyproject.display()))
}
