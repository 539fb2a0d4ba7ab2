pub use model_store::LoadErrorKind;

/// Everything the engine can fail with. The worker maps each variant to one protocol error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No model is resident, or the named one is not.
    #[error("{0}")]
    NotResident(String),
    /// A kept conversation named in a `cache_*` call is not there, or cannot do what was asked.
    #[error("{0}")]
    Conversation(String),
    /// `load` failed; resident models are untouched.
    #[error("{detail}")]
    Load { kind: LoadErrorKind, detail: String },
    /// The prompt does not fit the context limit.
    #[error("prompt has {prompt_tokens} tokens; the context limit is {context_length}")]
    ContextOverflow {
        prompt_tokens: usize,
        context_length: usize,
    },
    /// The request's KV cache and activations do not fit the memory MLX has left.
    #[error(
        "the prompt's {prompt_tokens} tokens need {:.2} GB of KV cache and activations and \
         {:.2} GB of memory is left ({tokens_that_fit} tokens fit): shorten the conversation, \
         lower the context length, or unload other models",
        *needed_bytes as f64 / 1e9, *available_bytes as f64 / 1e9
    )]
    MemoryBudget {
        prompt_tokens: usize,
        tokens_that_fit: usize,
        needed_bytes: u64,
        available_bytes: u64,
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
        Self::Generation(mlx_message(e.what()))
    }
}

impl From<mlx_rs::error::ConversionError> for EngineError {
    fn from(e: mlx_rs::error::ConversionError) -> Self {
        match e {
            mlx_rs::error::ConversionError::Exception(e) => e.into(),
            e => Self::Generation(e.to_string()),
        }
    }
}

impl From<mlx_rs::error::AsSliceError> for EngineError {
    fn from(e: mlx_rs::error::AsSliceError) -> Self {
        match e {
            mlx_rs::error::AsSliceError::Exception(e) => e.into(),
            e => Self::Generation(e.to_string()),
        }
    }
}

/// MLX's message without mlx-c's source location (`... at /path/to/transforms.cpp:73`), and
/// with what to do when it says a weight file could not be read: MLX reads some weights lazily,
/// at their first use, from the files found at load (`[read] Unable to read from file.`).
pub(crate) fn mlx_message(what: &str) -> String {
    let message = match what.rsplit_once(" at ") {
        Some((message, at)) if at.contains(".cpp:") => message,
        _ => what,
    };
    if message.starts_with("[read]") {
        format!(
            "{message} (MLX reads weights from the model's files at their first use: a file \
             changed, truncated or removed since load; load the model again)"
        )
    } else {
        message.to_string()
    }
}
