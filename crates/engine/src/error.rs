pub use model_store::LoadErrorKind;

/// Everything the engine can fail with. The worker maps each variant to one protocol error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No model is resident, or the named one is not.
    #[error("{0}")]
    NotResident(String),
    /// `load` failed; resident models are untouched.
    #[error("{detail}")]
    Load { kind: LoadErrorKind, detail: String },
    /// The prompt does not fit the context limit.
    #[error("prompt has {prompt_tokens} tokens; the context limit is {context_length}")]
    ContextOverflow {
        prompt_tokens: usize,
        context_length: usize,
    },
    /// A parameter is out of range in a way serde could not see (e.g. `top_p` > 1).
    #[error("{field}: {reason}")]
    InvalidParams { field: String, reason: String },
    /// The chat template failed to render (a template's `raise_exception`, a bad message).
    #[error("chat template: {0}")]
    Template(String),
    /// MLX reported an error while generating.
    #[error("generation failed: {0}")]
    Generation(String),
    /// A load was cancelled before it finished.
    #[error("cancelled")]
    Cancelled,
}

impl EngineError {
    pub(crate) fn load(kind: LoadErrorKind, detail: impl Into<String>) -> Self {
        Self::Load {
            kind,
            detail: detail.into(),
        }
    }
}

impl From<model_store::Error> for EngineError {
    fn from(e: model_store::Error) -> Self {
        match e {
            model_store::Error::Load { kind, detail } => Self::Load { kind, detail },
            model_store::Error::InvalidParams { field, reason } => {
                Self::InvalidParams { field, reason }
            }
            model_store::Error::Cancelled => Self::Cancelled,
        }
    }
}

impl From<mlx_rs::error::Exception> for EngineError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        Self::Generation(e.to_string())
    }
}
