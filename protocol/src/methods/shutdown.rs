//! `shutdown`: answer `{}`, cancel, free, exit 0.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::method;

method!(
    /// `shutdown`: the worker answers `{}` and exits 0; later requests get an error.
    Shutdown,
    "shutdown",
    ShutdownParams,
    ShutdownResult
);

/// Params of `shutdown` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShutdownParams {}

/// Result of `shutdown`: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShutdownResult {}
