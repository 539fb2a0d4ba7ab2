//! `.gguf` files: imported once (dequantized, tokenizer rebuilt) into a Hugging Face-layout
//! directory in the cache, which then loads like any other model directory.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{Error, LoadErrorKind};

/// Marks an import that finished; its first line names the importer version
/// ([`gguf::IMPORT_VERSION`]). A directory without it, or with another version, is redone.
const COMPLETE: &str = ".import-complete";

/// The imported directory for `gguf` in our cache (`<cache>/gguf-imports/<stem>-<size>-<mtime>`),
/// importing it first if needed.
pub fn imported_dir(gguf: &Path) -> Result<PathBuf, Error> {
    let meta = fs::metadata(gguf)
        .map_err(|e| Error::load(LoadErrorKind::NotFound, format!("{}: {e}", gguf.display())))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let stem = gguf.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let dir = crate::cache_root()?
        .join("gguf-imports")
        .join(format!("{stem}-{}-{mtime}", meta.len()));
    import_into(gguf, &dir)?;
    Ok(dir)
}

/// Whether `dir` holds a finished import by this importer version.
pub fn is_imported(dir: &Path) -> bool {
    fs::read_to_string(dir.join(COMPLETE))
        .is_ok_and(|m| m.lines().next() == Some(marker_line().as_str()))
}

/// Imports `gguf` into `dir` unless a finished import by this version is there: into a sibling
/// first, then renamed, so the directory appears whole or not at all.
pub fn import_into(gguf: &Path, dir: &Path) -> Result<(), Error> {
    if is_imported(dir) {
        return Ok(());
    }
    let failed = |e: std::io::Error| {
        Error::load(
            LoadErrorKind::InvalidWeights,
            format!("{}: {e}", dir.display()),
        )
    };
    let partial = dir.with_extension(format!("importing-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    tracing::info!(gguf = %gguf.display(), dir = %dir.display(), "importing GGUF");
    let report = gguf::import_hf_dir(gguf, &partial).map_err(|e| {
        let _ = fs::remove_dir_all(&partial);
        let kind = match e {
            // Named like a checkpoint whose model_type the engine has no family for.
            gguf::ImportError::UnsupportedArchitecture(_) => LoadErrorKind::UnsupportedArchitecture,
            gguf::ImportError::UnmappedTensor(_) => LoadErrorKind::GgufUnsupported,
            gguf::ImportError::Tokenizer(_) => LoadErrorKind::TokenizerMissing,
            _ => LoadErrorKind::InvalidWeights,
        };
        Error::load(kind, format!("{}: {e}", gguf.display()))
    })?;
    let marker = format!(
        "{}\n{} tensors, {} parameters\n",
        marker_line(),
        report.tensors_written,
        report.parameters
    );
    fs::write(partial.join(COMPLETE), marker).map_err(failed)?;
    if dir.exists() {
        // An unfinished or outdated import.
        fs::remove_dir_all(dir).map_err(failed)?;
    }
    fs::rename(&partial, dir).map_err(failed)
}

fn marker_line() -> String {
    format!("gguf import v{}", gguf::IMPORT_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 header with no tensors and one metadata entry, `general.architecture`.
    fn gguf_of_architecture(arch: &str) -> Vec<u8> {
        let string = |s: &str| [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat();
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes()); // tensors
        bytes.extend(1u64.to_le_bytes()); // metadata entries
        bytes.extend(string("general.architecture"));
        bytes.extend(8u32.to_le_bytes()); // string
        bytes.extend(string(arch));
        bytes
    }

    #[test]
    fn an_unknown_architecture_is_unsupported_architecture_by_name() {
        let dir = std::env::temp_dir().join(format!("gguf-import-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let gguf = dir.join("mamba.gguf");
        fs::write(&gguf, gguf_of_architecture("mamba")).unwrap();
        let err = import_into(&gguf, &dir.join("out")).unwrap_err();
        let _ = fs::remove_dir_all(&dir);
        match err {
            Error::Load { kind, detail } => {
                assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
                assert!(
                    detail.contains("\"mamba\"") && detail.contains("qwen3moe"),
                    "{detail}"
                );
            }
            other => panic!("expected a load error, got {other:?}"),
        }
    }
}
