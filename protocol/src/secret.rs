//! [`Secret`]: a string that never shows in `Debug` output or logs.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A credential such as `hf_token`.
///
/// `Debug` and `Display` print `<redacted>`; the value is reached only through
/// [`Secret::expose`]. It serialises as the plain string so that a host can send it; the worker
/// never puts one into a response, a notification, a log line or the environment. Its bytes are
/// overwritten with zeros when it is dropped.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential itself; use it only where it is needed (the hub client).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_owned())
    }
}
