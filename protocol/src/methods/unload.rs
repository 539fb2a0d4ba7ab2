//! `unload`: free one resident model, or all of them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{method, MemoryInfo};

method!(
    /// `unload`: frees models and clears MLX's cache.
    Unload,
    "unload",
    UnloadParams,
    UnloadResult
);

/// Params of `unload`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnloadParams {
    /// The model to unload; default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Result of `unload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UnloadResult {
    /// Ids of the models unloaded.
    pub unloaded: Vec<String>,
    /// Memory afterwards.
    pub memory: MemoryInfo,
}
