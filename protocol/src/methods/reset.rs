//! `reset`: clear MLX's buffer cache and any prompt cache.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{method, MemoryInfo};

method!(
    /// `reset`: clears caches; resident models stay.
    Reset,
    "reset",
    ResetParams,
    ResetResult
);

/// Params of `reset` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetParams {}

/// Result of `reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResetResult {
    /// Memory afterwards.
    pub memory: MemoryInfo,
}
