//! `cancel` and the two cancellation notifications hosts already send.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{method, notification};
use crate::envelope::RequestId;

method!(
    /// `cancel`: cancels a queued or running request; answered at once.
    Cancel,
    "cancel",
    CancelParams,
    CancelResult
);

/// Params of `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelParams {
    /// The id of the queued or running request to cancel.
    pub request_id: RequestId,
}

/// Result of `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelResult {
    /// True when the request was queued or running and is now cancelled.
    pub cancelled: bool,
}

notification!(
    /// `$/cancelRequest` (LSP style): same as `cancel`, without an answer.
    CancelRequestNotification,
    "$/cancelRequest",
    CancelRequestParams
);

/// Params of `$/cancelRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelRequestParams {
    /// The id of the request to cancel.
    pub id: RequestId,
}

notification!(
    /// `notifications/cancelled` (MCP style): same as `cancel`, without an answer.
    CancelledNotification,
    "notifications/cancelled",
    CancelledParams
);

/// Params of `notifications/cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelledParams {
    /// The id of the request to cancel.
    #[serde(rename = "requestId")]
    pub request_id: RequestId,
    /// Why, for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
