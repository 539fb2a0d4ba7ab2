//! Per-architecture knowledge: GGUF hyperparameters to `config.json`, GGUF tensor names to
//! Hugging Face names, and the layout fixes a tensor needs on the way.
//!
//! Adding an architecture (gemma3, say) means a new file beside `llama.rs` with the same three
//! functions, and a variant in [`Architecture`].

mod llama;

use serde_json::{Map, Value};

use crate::{GgufError, GgufFile, ImportError};

/// An architecture the importer can convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Architecture {
    Llama,
}

/// What to do to a tensor's rows between dequantizing and writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transform {
    /// Write as dequantized.
    None,
    /// Undo llama.cpp's rotary row interleave of a q/k projection with this many heads.
    UnpermuteHeads(usize),
}

/// A tensor's destination in the Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorTarget {
    pub hf_name: String,
    pub transform: Transform,
}

impl Architecture {
    /// The architecture named by `general.architecture`.
    pub fn of(file: &GgufFile) -> Result<Self, ImportError> {
        match file.architecture()? {
            "llama" => Ok(Self::Llama),
            other => Err(ImportError::UnsupportedArchitecture(other.to_owned())),
        }
    }

    /// The GGUF metadata key prefix (`llama.` ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
        }
    }

    /// Hyperparameters read from the metadata.
    pub fn hyperparameters(self, file: &GgufFile) -> Result<Hyperparameters, ImportError> {
        Hyperparameters::read(file, self.name())
    }

    /// The architecture-specific part of `config.json`.
    pub fn config(self, hp: &Hyperparameters) -> Map<String, Value> {
        match self {
            Self::Llama => llama::config(hp),
        }
    }

    /// Where a GGUF tensor goes, or `None` if the architecture has no place for it.
    pub fn target(self, gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
        match self {
            Self::Llama => llama::target(gguf_name, hp),
        }
    }

    /// The Hugging Face tensors a complete checkpoint has (without the output head).
    pub fn required_tensors(self, hp: &Hyperparameters) -> Vec<String> {
        match self {
            Self::Llama => llama::required_tensors(hp),
        }
    }
}

/// The hyperparameters llama-family GGUFs store under `<arch>.*`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hyperparameters {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: usize,
}

impl Hyperparameters {
    fn read(file: &GgufFile, arch: &str) -> Result<Self, ImportError> {
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size: usize = file.require(&key("embedding_length"))?;
        let num_heads: usize = file.require(&key("attention.head_count"))?;
        if num_heads == 0 || hidden_size == 0 {
            return Err(ImportError::Inconsistent(format!(
                "{arch}.embedding_length and {arch}.attention.head_count must be positive"
            )));
        }
        let head_dim = file
            .get_as(&key("attention.key_length"))?
            .unwrap_or(hidden_size / num_heads);
        Ok(Self {
            hidden_size,
            intermediate_size: file.require(&key("feed_forward_length"))?,
            num_layers: file.require(&key("block_count"))?,
            num_heads,
            num_kv_heads: file
                .get_as(&key("attention.head_count_kv"))?
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: f32_value(file, &key("attention.layer_norm_rms_epsilon"))?
                .ok_or_else(|| GgufError::MissingKey(key("attention.layer_norm_rms_epsilon")))?,
            rope_theta: f32_value(file, &key("rope.freq_base"))?.unwrap_or(10_000.0),
            context_length: file.require(&key("context_length"))?,
        })
    }
}

/// A float metadata value as the shortest decimal that round-trips its stored precision, so
/// an f32 `1e-5` lands in JSON as `1e-05`, not `9.999999747378752e-06`.
fn f32_value(file: &GgufFile, key: &str) -> Result<Option<f64>, GgufError> {
    Ok(match file.get(key) {
        Some(crate::MetadataValue::F32(v)) => {
            Some(v.to_string().parse().expect("f32 display parses as f64"))
        }
        _ => file.get_as::<f64>(key)?,
    })
}
