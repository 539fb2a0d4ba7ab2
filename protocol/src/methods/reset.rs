//! `reset`: clear MLX's buffer cache and, unless told to keep them, the prompt caches.

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

/// Params of `reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetParams {
    /// Also clear every resident's prompt cache; default true. Studio resets after every
    /// stopped reply and keeps its conversations' caches (`false`).
    #[serde(default = "super::default_true")]
    pub prompt_cache: bool,
}

impl Default for ResetParams {
    fn default() -> Self {
        Self { prompt_cache: true }
    }
}

/// Result of `reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResetResult {
    /// Memory afterwards.
    pub memory: MemoryInfo,
}
