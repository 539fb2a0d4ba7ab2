//! Engine errors as protocol errors: the one place where each [`EngineError`] gets its code.

use mlx_engine::{EngineError, LoadErrorKind as EngineLoadKind};
use protocol::{error::MemoryBudgetData, ErrorCode, LoadErrorKind, ResponseError};

/// The protocol error for an engine error (see protocol.md's error table).
pub fn engine_error(error: EngineError) -> ResponseError {
    let message = error.to_string();
    match error {
        EngineError::NotResident(message) => ResponseError::new(ErrorCode::NoModel, message),
        EngineError::Conversation(message) => ResponseError::new(ErrorCode::InvalidParams, message),
        EngineError::Load { kind, detail } => ResponseError::load_failed(load_kind(kind), detail),
        EngineError::ContextOverflow {
            prompt_tokens,
            context_length,
        } => ResponseError::context_overflow(prompt_tokens as u64, context_length as u64),
        EngineError::MemoryBudget {
            prompt_tokens,
            tokens_that_fit,
            needed_bytes,
            available_bytes,
        } => ResponseError::memory_budget(
            message,
            MemoryBudgetData {
                prompt_tokens: prompt_tokens as u64,
                tokens_that_fit: tokens_that_fit as u64,
                needed_bytes,
                available_bytes,
            },
        ),
        EngineError::InvalidParams { field, reason } => {
            ResponseError::invalid_params(field, reason)
        }
        EngineError::Template(reason) => ResponseError::invalid_params("messages", reason),
        EngineError::Generation(detail) => ResponseError::generation_failed(detail),
        EngineError::Cancelled => ResponseError::request_cancelled(),
    }
}

fn load_kind(kind: EngineLoadKind) -> LoadErrorKind {
    match kind {
        EngineLoadKind::NotFound => LoadErrorKind::NotFound,
        EngineLoadKind::UnsupportedArchitecture => LoadErrorKind::UnsupportedArchitecture,
        EngineLoadKind::InvalidWeights => LoadErrorKind::InvalidWeights,
        EngineLoadKind::TokenizerMissing => LoadErrorKind::TokenizerMissing,
        EngineLoadKind::AuthRequired => LoadErrorKind::AuthRequired,
        EngineLoadKind::Network => LoadErrorKind::Network,
        EngineLoadKind::OutOfMemory => LoadErrorKind::OutOfMemory,
        EngineLoadKind::GgufUnsupported => LoadErrorKind::GgufUnsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::error::{ContextOverflowData, InvalidParamsData, LoadFailedData};

    #[test]
    fn each_engine_error_gets_its_code_and_data() {
        let e = engine_error(EngineError::Load {
            kind: EngineLoadKind::UnsupportedArchitecture,
            detail: "mamba".into(),
        });
        assert_eq!(e.error_code(), Some(ErrorCode::LoadFailed));
        let data: LoadFailedData = e.data_as().unwrap();
        assert_eq!(
            (data.kind, data.detail.as_str()),
            (LoadErrorKind::UnsupportedArchitecture, "mamba")
        );

        let e = engine_error(EngineError::ContextOverflow {
            prompt_tokens: 9,
            context_length: 8,
        });
        assert_eq!(e.error_code(), Some(ErrorCode::ContextOverflow));
        assert_eq!(
            e.data_as::<ContextOverflowData>().unwrap(),
            ContextOverflowData {
                prompt_tokens: 9,
                context_length: 8
            }
        );

        let e = engine_error(EngineError::Template("raised".into()));
        assert_eq!(e.error_code(), Some(ErrorCode::InvalidParams));
        assert_eq!(e.data_as::<InvalidParamsData>().unwrap().field, "messages");

        for (error, code) in [
            (EngineError::NotResident("x".into()), ErrorCode::NoModel),
            (
                EngineError::Generation("mlx".into()),
                ErrorCode::GenerationFailed,
            ),
            (EngineError::Cancelled, ErrorCode::RequestCancelled),
            (
                EngineError::InvalidParams {
                    field: "top_k".into(),
                    reason: "too big".into(),
                },
                ErrorCode::InvalidParams,
            ),
        ] {
            assert_eq!(engine_error(error).error_code(), Some(code));
        }
    }
}
