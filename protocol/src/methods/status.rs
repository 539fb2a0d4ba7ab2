//! `status`: what the worker is doing; answered at once, even during a generation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{method, GroupInfo, MemoryInfo, ModelInfo, PromptCacheInfo};

method!(
    /// `status`: the worker's state, models, queue and memory.
    Status,
    "status",
    StatusParams,
    StatusResult
);

/// Params of `status` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {}

/// What the worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Nothing running.
    Idle,
    /// A `load` runs.
    Loading,
    /// A `generate` runs.
    Generating,
}

/// A resident model: its id and its [`ModelInfo`] members side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResidentModel {
    /// The model's id (as returned by `load`).
    pub model_id: String,
    /// What was loaded.
    #[serde(flatten)]
    pub info: ModelInfo,
}

/// The queue of `load`/`generate`/`unload`/`reset`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueInfo {
    /// Requests running (0 or 1).
    pub running: u32,
    /// Requests waiting.
    pub waiting: u32,
}

/// Result of `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusResult {
    /// What the worker is doing.
    pub state: WorkerState,
    /// The active model's id; `null` when none is loaded.
    pub active_model: Option<String>,
    /// Every resident model.
    pub models: Vec<ResidentModel>,
    /// The queue.
    pub queue: QueueInfo,
    /// MLX memory.
    pub memory: MemoryInfo,
    /// Time since start (ms).
    pub uptime_ms: u64,
    /// Requests answered so far.
    pub requests_served: u64,
    /// The prompt cache's tiers: what they hold and their hit rates.
    #[serde(default)]
    pub prompt_cache: PromptCacheInfo,
    /// The group of ranks the worker runs as; absent for one process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupInfo>,
}
