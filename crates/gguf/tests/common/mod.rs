//! Helpers for the tests on real GGUF files (`smollm2.rs`, `gemma3.rs`).

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gguf::ImportReport;
use safetensors::SafeTensors;
use serde_json::Value;

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

/// `gguf` imported once per test process (kept in `cell`), after `check` has looked at the
/// report, into `name` under Cargo's temporary directory for integration tests: a fixed place,
/// emptied first, so that no run leaves a gigabyte behind (a `TempDir` in a static never drops).
pub fn import_once(
    cell: &'static OnceLock<Option<PathBuf>>,
    name: &str,
    gguf: impl FnOnce() -> Option<PathBuf>,
    check: impl FnOnce(&ImportReport),
) -> Option<&'static Path> {
    cell.get_or_init(|| {
        let gguf = gguf()?;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        check(&gguf::import_hf_dir(&gguf, &dir).unwrap());
        Some(dir)
    })
    .as_deref()
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
