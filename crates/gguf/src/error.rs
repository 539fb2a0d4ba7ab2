//! Error types. Each message says what went wrong and, where there is one, what to do.

use std::path::PathBuf;

use crate::GgmlType;

/// Failure to read a GGUF file or one of its parts.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("not a GGUF file (magic {found:02x?}, expected \"GGUF\"): check the path points at a .gguf model")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A GGUF version this reader does not handle.
    #[error("GGUF version {0} is not supported (versions 2 and 3 are): re-convert the model with a current llama.cpp")]
    UnsupportedVersion(u32),
    /// The file ends (or a length field points) before a structure is complete.
    #[error("GGUF file is truncated or corrupt: {what} needs {needed} bytes at offset {offset}, the file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// File size.
        len: u64,
    },
    /// A metadata value type id outside the GGUF specification.
    #[error("metadata key {key:?} has unknown value type {type_id}: the file is corrupt or from a newer GGUF version")]
    BadValueType {
        /// The key being read.
        key: String,
        /// The type id found.
        type_id: u32,
    },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8: the file is corrupt")]
    InvalidUtf8 {
        /// Which string.
        what: String,
    },
    /// A metadata key the caller needs is absent.
    #[error("metadata key {0:?} is missing: this GGUF lacks information the importer needs")]
    MissingKey(String),
    /// A metadata key holds a value of another type than expected.
    #[error("metadata key {key:?} should be {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller wanted.
        expected: &'static str,
        /// What the file holds.
        found: &'static str,
    },
    /// No tensor of that name.
    #[error("tensor {0:?} is not in the file")]
    MissingTensor(String),
    /// A tensor whose extent or type is inconsistent.
    #[error("tensor {name:?}: {reason}")]
    BadTensor {
        /// The tensor.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Dequantization failed.
    #[error("tensor {name:?}: {source}")]
    Dequant {
        /// The tensor.
        name: String,
        /// Why.
        source: DequantError,
    },
}

/// Failure to turn quantized bytes into `f32` values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// A type without a dequantizer here.
    #[error("element type {0} cannot be dequantized by this crate (supported: F32, F16, BF16, F64, I8, I16, I32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4); use a GGUF with one of these")]
    Unsupported(GgmlType),
    /// The element count is not a whole number of blocks.
    #[error("{n} values are not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// Values asked for.
        n: usize,
        /// Values per block.
        block: usize,
    },
    /// The byte buffer has the wrong size for the element count.
    #[error("{n} values of {ty} need {expected} bytes, got {got}")]
    WrongByteCount {
        /// The type.
        ty: GgmlType,
        /// Values asked for.
        n: usize,
        /// Bytes the values need.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// Failure to import a GGUF into a Hugging Face-layout directory.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Reading the GGUF failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` names an architecture the importer has no mapping for.
    #[error("GGUF architecture {0:?} cannot be imported yet (supported: {supported}); load the original checkpoint instead, or add the architecture in crates/gguf/src/arch/", supported = crate::arch::supported_names())]
    UnsupportedArchitecture(String),
    /// A tensor name with no Hugging Face counterpart for this architecture.
    #[error("tensor {0:?} has no Hugging Face name for this architecture; the importer's mapping needs extending")]
    UnmappedTensor(String),
    /// The metadata contradicts itself or the tensors.
    #[error("inconsistent model: {0}")]
    Inconsistent(String),
    /// The tokenizer could not be rebuilt.
    #[error("cannot rebuild the tokenizer: {0}")]
    Tokenizer(String),
    /// Writing the output failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The safetensors writer failed.
    #[error("cannot write {path}: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the writer said.
        source: safetensors::SafeTensorError,
    },
}
