//! `load`: make a model resident (and active), with `load/progress` notifications.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{notification, Dtype, MemoryInfo, Method, ModelInfo, ParallelMode};
use crate::envelope::RequestId;
use crate::error::ResponseError;
use crate::params::with_defaults;
use crate::secret::Secret;

/// `load`: loads a model; the last one loaded is the active one.
#[derive(Debug, Clone, Copy)]
pub enum Load {}

impl Method for Load {
    const NAME: &'static str = "load";
    type Params = LoadParams;
    type Result = LoadResult;

    fn validate(params: &LoadParams) -> Result<(), ResponseError> {
        if params.model.trim().is_empty() {
            return Err(ResponseError::invalid_params(
                "model",
                "must name a Hugging Face repo, a model directory or a .gguf file",
            ));
        }
        if let Some(bits) = params.kv_bits {
            if bits != 4 && bits != 8 {
                return Err(ResponseError::invalid_params(
                    "kv_bits",
                    format!("must be 4 or 8, not {bits}"),
                ));
            }
        }
        Ok(())
    }
}

fn default_revision() -> String {
    "main".to_owned()
}

/// Params of `load`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadParams {
    /// A Hugging Face repo id (`org/name`), a local model directory, or a `.gguf` file.
    pub model: String,
    /// Hub revision; default `"main"`.
    #[serde(default = "default_revision")]
    pub revision: String,
    /// A LoRA adapter directory or repo id applied on top of `model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Context limit; 0 (the default) means the model's own `max_position_embeddings`.
    #[serde(default)]
    pub max_seq_length: u64,
    /// Quantize on load to affine 4-bit, group 64, unless already quantized.
    #[serde(default)]
    pub load_in_4bit: bool,
    /// Compute dtype for unquantized weights; default from the model's config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// Hub token: used for the hub only, never logged or echoed (`Debug` shows `<redacted>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token: Option<Secret>,
    /// Accepted for compatibility; no remote code ever runs (a warning is logged when true).
    #[serde(default)]
    pub trust_remote_code: bool,
    /// Hint only; the worker detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_vision: Option<bool>,
    /// Hint only; the worker detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_lora: Option<bool>,
    /// Hint only; the worker detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_gguf: Option<bool>,
    /// A Jinja chat template used instead of the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_override: Option<String>,
    /// Quantize the KV cache to this many bits (4 or 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bits: Option<u8>,
    /// A smaller model with the same tokenizer (directory, `.gguf` or repo id, same `hf_token`),
    /// loaded beside this one for `speculative: {"method": "draft_model"}` on `generate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// Split the model over the worker's group of ranks: `"tensor"` or `"pipeline"`. Only when
    /// the worker runs as a group (`initialize`'s `group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelMode>,
    /// Reload even if this model is already resident.
    #[serde(default)]
    pub force: bool,
}

impl LoadParams {
    /// Params for `model` with every other field at its default.
    pub fn new(model: impl Into<String>) -> Self {
        with_defaults(json!({ "model": model.into() }))
    }
}

/// Result of `load`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadResult {
    /// The id to name this model by in later requests.
    pub model_id: String,
    /// What was loaded.
    pub info: ModelInfo,
    /// Wall time of the load (ms).
    pub load_ms: u64,
    /// Memory after the load.
    pub memory: MemoryInfo,
}

notification!(
    /// `load/progress`: sent while a `load` runs.
    LoadProgressNotification,
    "load/progress",
    LoadProgress
);

/// A stage of loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoadStage {
    /// Finding the files.
    Resolve,
    /// Downloading from the hub.
    Download,
    /// Reading weights.
    Weights,
    /// Reading the tokenizer.
    Tokenizer,
    /// Done.
    Ready,
}

/// Params of `load/progress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LoadProgress {
    /// The id of the `load` request.
    pub request_id: RequestId,
    /// The stage.
    pub stage: LoadStage,
    /// Units done in this stage (bytes or files).
    pub done: u64,
    /// Units in this stage (0 when unknown).
    pub total: u64,
    /// A line for people.
    #[serde(default)]
    pub message: String,
}
