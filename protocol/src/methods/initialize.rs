//! `initialize`: optional handshake; tells the host what this worker and machine can do.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{method, GroupInfo};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: &str = "1";

method!(
    /// `initialize`: optional; any request may come first.
    Initialize,
    "initialize",
    InitializeParams,
    InitializeResult
);

/// A program's name and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProgramInfo {
    /// Its name, e.g. `"unsloth-studio"`.
    pub name: String,
    /// Its version.
    pub version: String,
}

/// The host that calls, as LSP's `clientInfo`: a name, a version if it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClientInfo {
    /// Its name, e.g. `"unsloth-studio"`.
    pub name: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Params of `initialize`; all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InitializeParams {
    /// Who is calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientInfo>,
    /// The protocol version the host speaks (`"1"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
}

/// The MLX backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Apple GPU.
    Metal,
    /// NVIDIA GPU.
    Cuda,
    /// CPU only.
    Cpu,
}

/// The device MLX computes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceInfo {
    /// Its name, e.g. `"Apple M2 Max"`.
    pub name: String,
    /// Its memory (bytes).
    pub memory_bytes: u64,
    /// On Metal, the recommended working-set size (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended_working_set_bytes: Option<u64>,
}

/// MLX's version, backend and device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MlxInfo {
    /// MLX's version.
    pub version: String,
    /// The backend.
    pub backend: Backend,
    /// The device.
    pub device: DeviceInfo,
}

/// What the worker supports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    /// `model_type`s the worker can load, e.g. `["llama", "qwen2"]`.
    pub architectures: Vec<String>,
    /// Image inputs are supported.
    pub vision: bool,
    /// LoRA adapters are supported.
    pub lora: bool,
    /// GGUF files are supported.
    pub gguf: bool,
    /// The queue's capacity (`--max-queue`).
    pub max_queue: usize,
    /// Most generations that run together, sharing each decode step (`--max-batch`; 1: one at
    /// a time).
    pub max_batch: usize,
    /// How generations that run together attend (`--batch-attention`, `auto` resolved).
    pub batch_attention: BatchAttention,
}

/// How the rows of a batch attend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BatchAttention {
    /// Each over its own cache: a request's tokens are bit for bit those it gets alone (on the
    /// CPU; a GPU's matmuls may still sum a batch in another order).
    Rows,
    /// Over one padded cache (the default): on the CPU bit for bit as `rows`; on a GPU all rows
    /// in one call and requests arriving together prefilled in one pass, so a request's last
    /// bits may differ from its lone run's and greedy text can part at a near tie.
    Padded,
}

/// Result of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InitializeResult {
    /// The protocol version the worker speaks ([`PROTOCOL_VERSION`]).
    pub protocol_version: String,
    /// The worker's name and version.
    pub worker: ProgramInfo,
    /// MLX's version, backend and device.
    pub mlx: MlxInfo,
    /// What the worker supports.
    pub capabilities: Capabilities,
    /// The group of ranks the worker runs as; absent for one process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupInfo>,
}
