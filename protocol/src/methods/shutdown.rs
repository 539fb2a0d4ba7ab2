//! `shutdown`: finish the work received before it, answer `{}`, free, exit 0.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::method;

method!(
    /// `shutdown`: the requests received before it run and are answered first (`status` and
    /// `cancel` still work meanwhile; new work gets an error), then the worker answers `{}`,
    /// frees MLX memory and exits 0.
    Shutdown,
    "shutdown",
    ShutdownParams,
    ShutdownResult
);

/// Params of `shutdown` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShutdownParams {}

/// Result of `shutdown`: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShutdownResult {}
