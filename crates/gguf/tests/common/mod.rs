//! Helpers for the tests on real GGUF files (`smollm2.rs`, `gemma3.rs`).

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use gguf::ImportReport;
use safetensors::SafeTensors;
use serde_json::Value;
use tempfile::TempDir;

/// The real GGUF `file_name`: from `env_var` if set, else from the `cargo xtask setup` cache
/// (`<cache>/gguf/`, `model_store::cache_root`). `None` (with a note) when it
/// is missing, unless `MLX_WORKER_REQUIRE_MODELS=1`, which makes that a panic.
pub fn real_gguf(env_var: &str, file_name: &str) -> Option<PathBuf> {
    let path = match std::env::var_os(env_var) {
        Some(p) => PathBuf::from(p),
        None => model_store::cache_root().ok()?.join("gguf").join(file_name),
    };
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("MLX_WORKER_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "MLX_WORKER_REQUIRE_MODELS=1 but {} is missing: run `cargo xtask setup` or set {env_var}",
            path.display()
        );
    }
    eprintln!(
        "note: {} not found, skipping (run `cargo xtask setup`)",
        path.display()
    );
    None
}

/// `gguf` imported into a fresh directory under Cargo's temporary directory for integration
/// tests, after `check` has looked at the report. The import is a gigabyte of float32 weights:
/// it is removed when the returned directory drops, at the end of the one test that reads it.
pub fn import(gguf: &Path, check: impl FnOnce(&ImportReport)) -> TempDir {
    let dir = TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    check(&gguf::import_hf_dir(gguf, dir.path()).unwrap());
    dir
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A float32 tensor of the imported checkpoint.
pub fn tensor_f32(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
