/// Why a model failed to load; the worker sends it as `-32002`'s `data.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadErrorKind {
    NotFound,
    UnsupportedArchitecture,
    InvalidWeights,
    TokenizerMissing,
    AuthRequired,
    Network,
    OutOfMemory,
    GgufUnsupported,
}

/// What finding a model's files can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The files are not there, not reachable, or not a model.
    #[error("{detail}")]
    Load { kind: LoadErrorKind, detail: String },
    /// A request field is unusable (e.g. a revision that is no branch, tag or commit).
    #[error("{field}: {reason}")]
    InvalidParams { field: String, reason: String },
    /// Cancelled between downloads.
    #[error("cancelled")]
    Cancelled,
}

impl Error {
    pub(crate) fn load(kind: LoadErrorKind, detail: impl Into<String>) -> Self {
        Self::Load {
            kind,
            detail: detail.into(),
        }
    }
}
