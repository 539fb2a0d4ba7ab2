//! `.gguf` files: imported once (dequantized, tokenizer rebuilt) into a Hugging Face-layout
//! directory in the cache, which then loads like any other model directory.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::error::{EngineError, LoadErrorKind};

/// Marks an import that finished; a directory without it is redone.
const COMPLETE: &str = ".import-complete";

/// The imported directory for `gguf`, importing it first if needed.
pub fn imported_dir(gguf: &Path) -> Result<PathBuf, EngineError> {
    let meta = fs::metadata(gguf).map_err(|e| {
        EngineError::load(LoadErrorKind::NotFound, format!("{}: {e}", gguf.display()))
    })?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let stem = gguf.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let version = gguf::IMPORT_VERSION;
    let dir = cache_root()?.join(format!("{stem}-{}-{mtime}-v{version}", meta.len()));
    if dir.join(COMPLETE).is_file() {
        return Ok(dir);
    }
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    gguf::import_hf_dir(gguf, &partial).map_err(|e| {
        let kind = match e {
            gguf::ImportError::UnsupportedArchitecture(_)
            | gguf::ImportError::UnmappedTensor(_) => LoadErrorKind::GgufUnsupported,
            gguf::ImportError::Tokenizer(_) => LoadErrorKind::TokenizerMissing,
            _ => LoadErrorKind::InvalidWeights,
        };
        EngineError::load(kind, format!("{}: {e}", gguf.display()))
    })?;
    let written = fs::write(partial.join(COMPLETE), b"").and_then(|_| {
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&partial, &dir)
    });
    written.map_err(|e| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("{}: {e}", dir.display()),
        )
    })?;
    Ok(dir)
}

fn cache_root() -> Result<PathBuf, EngineError> {
    let base = std::env::var_os("MLX_WORKER_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("mlx-worker")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mlx-worker")))
        .ok_or_else(|| {
            EngineError::load(
                LoadErrorKind::NotFound,
                "set HOME or MLX_WORKER_CACHE: GGUF imports are cached there",
            )
        })?;
    Ok(base.join("gguf-imports"))
}
