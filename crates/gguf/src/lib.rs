//! Pure-Rust reader for GGUF files (the llama.cpp model format) and an importer that turns one
//! into a Hugging Face-layout model directory (`config.json`, float32 `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`).
//!
//! No MLX in here: the engine loads the imported directory like any other checkpoint.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("model.gguf".as_ref())?;
//! println!("{}", file.architecture()?);
//! let report = gguf::import_hf_dir("model.gguf".as_ref(), "out-dir".as_ref())?;
//! println!("{} tensors written", report.tensors_written);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod arch;
pub mod dequant;
mod error;
mod ggml_type;
mod import;
mod metadata;
mod reader;
pub mod tokenizer;
mod tokenizer_spm;

pub use error::{DequantError, GgufError, ImportError};

/// The version of what [`import_hf_dir`] writes. Caches of imported directories include it, so
/// a change to the output (a fixed tensor, a new config field) is bumped here and re-imports.
pub const IMPORT_VERSION: u32 = 2;
pub use ggml_type::GgmlType;
pub use import::{import_hf_dir, ImportReport};
pub use metadata::MetadataValue;
pub use reader::{FromMetadata, GgufFile, TensorInfo};
#[cfg(test)]
mod test_file;
