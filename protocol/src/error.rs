//! Error responses: the codes of the contract and the typed `data` each one carries.

use std::fmt;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The schema of an error's `data` type, or `None` for a code without data.
macro_rules! data_schema {
    ($generator:ident) => {
        None
    };
    ($generator:ident, $data:ty) => {
        Some($generator.subschema_for::<$data>())
    };
}

/// Declares [`ErrorCode`] from one table: each code's variant, number, `data` type and meaning.
/// Its number is written in code here and nowhere else: [`ErrorCode::code`], [`ErrorCode::ALL`],
/// the variants' docs and the schema's `errors` index all come from this table. (The `data`
/// types' doc comments name their code too: they are the schema's descriptions for hosts.)
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $name:ident = $code:literal $(, data: $data:ty)?;)*) => {
        /// Every error code of the contract, with its number.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i64)]
        pub enum ErrorCode {
            $(
                #[doc = concat!("`", stringify!($code), "`:")]
                $(#[doc = $doc])*
                $(#[doc = concat!("`data` is [`", stringify!($data), "`].")])?
                $name = $code,
            )*
        }

        impl ErrorCode {
            /// Every code, in the order of the contract's table.
            pub const ALL: [ErrorCode; [$(ErrorCode::$name),*].len()] = [$(ErrorCode::$name),*];

            /// The schema of this code's `data`, if it carries any.
            pub(crate) fn data_schema(
                self,
                generator: &mut schemars::SchemaGenerator,
            ) -> Option<schemars::Schema> {
                match self {
                    $(ErrorCode::$name => data_schema!(generator $(, $data)?),)*
                }
            }
        }
    };
}

error_codes! {
    /// the line is not valid UTF-8 or not valid JSON. The response's id is null.
    ParseError = -32700;
    /// not an object, no method, a batch, or a line over the length limit.
    InvalidRequest = -32600;
    /// no such method.
    MethodNotFound = -32601;
    /// a parameter is missing or wrong.
    InvalidParams = -32602, data: InvalidParamsData;
    /// a fault inside the worker.
    InternalError = -32603;
    /// no model is loaded, or the named model is not resident.
    NoModel = -32001;
    /// a `load` failed. Resident models are untouched.
    LoadFailed = -32002, data: LoadFailedData;
    /// the queue is full. Retry later.
    Busy = -32003, data: BusyData;
    /// the prompt is longer than the context limit.
    ContextOverflow = -32004, data: ContextOverflowData;
    /// generation failed inside MLX.
    GenerationFailed = -32005, data: GenerationFailedData;
    /// the request's KV cache and activations do not fit the memory MLX has left.
    MemoryBudget = -32006, data: MemoryBudgetData;
    /// a request other than `generate` was cancelled before it ran.
    RequestCancelled = -32800;
}

impl ErrorCode {
    /// The number on the wire.
    pub const fn code(self) -> i64 {
        self as i64
    }

    /// The code with this number, if the contract defines one.
    pub fn from_code(code: i64) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.code() == code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

/// Studio's audio commands: not methods of this worker, answered `-32601` with a message that
/// says audio is not supported.
pub const AUDIO_METHODS: [&str; 2] = ["generate_audio", "generate_audio_input"];

/// The `error` member of a response: `{code, message, data?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[error("{message} (JSON-RPC error {code})")]
pub struct ResponseError {
    /// The error's number; see [`ErrorCode`] for those the contract defines.
    pub code: i64,
    /// A sentence for people: what went wrong and, where possible, what to do.
    pub message: String,
    /// Structured detail; its shape depends on `code` (see [`ErrorCode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ResponseError {
    /// An error with this code and message and no data.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ResponseError {
            code: code.code(),
            message: message.into(),
            data: None,
        }
    }

    /// The same error with `data` set to the JSON form of `data`.
    ///
    /// # Panics
    /// Panics if `data` cannot be represented as JSON; the data types of this module always can.
    pub fn with_data(mut self, data: impl Serialize) -> Self {
        self.data = Some(serde_json::to_value(data).expect("error data serialises to JSON"));
        self
    }

    /// The contract's code for this error, if it is one of them.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_code(self.code)
    }

    /// Decodes `data` as `T` (e.g. [`LoadFailedData`] for a [`ErrorCode::LoadFailed`]); `None`
    /// if absent or of another shape.
    pub fn data_as<T: DeserializeOwned>(&self) -> Option<T> {
        self.data
            .as_ref()
            .and_then(|d| serde_json::from_value(d.clone()).ok())
    }

    /// [`ErrorCode::ParseError`]: the line is not valid UTF-8 or not JSON; `detail` says where.
    pub fn parse_error(detail: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::ParseError,
            format!("parse error: {detail}; send one UTF-8 JSON object per line"),
        )
    }

    /// [`ErrorCode::InvalidRequest`] for a line longer than `limit` bytes.
    pub fn line_too_long(limit: usize) -> Self {
        Self::new(
            ErrorCode::InvalidRequest,
            format!(
                "invalid request: the line is longer than {limit} bytes and was discarded; \
                 send smaller messages or raise --max-line-bytes"
            ),
        )
    }

    /// [`ErrorCode::MethodNotFound`] for an unknown method; for one of [`AUDIO_METHODS`] the
    /// message says that audio is not supported.
    pub fn method_not_found(method: &str) -> Self {
        let message = if AUDIO_METHODS.contains(&method) {
            format!(
                "method not found: `{method}`: audio is not supported; mlx-worker runs text chat \
                 models (no speech generation, no audio input)"
            )
        } else {
            format!("method not found: `{method}`; see protocol.md for the methods")
        };
        Self::new(ErrorCode::MethodNotFound, message)
    }

    /// [`ErrorCode::InvalidParams`] for a bad parameter: `field` is its JSON path (e.g.
    /// `messages[0].role`).
    pub fn invalid_params(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let data = InvalidParamsData {
            field: field.into(),
            reason: reason.into(),
        };
        Self::new(
            ErrorCode::InvalidParams,
            format!("invalid params: `{}`: {}", data.field, data.reason),
        )
        .with_data(data)
    }

    /// [`ErrorCode::InternalError`]: a fault inside the worker.
    pub fn internal(detail: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::InternalError,
            format!("internal error: {detail}"),
        )
    }

    /// [`ErrorCode::NoModel`]: no model loaded, or `model` is not resident.
    pub fn no_model(model: Option<&str>) -> Self {
        let message = match model {
            Some(m) => format!("model `{m}` is not resident; `load` it first"),
            None => "no model is loaded; call `load` first".to_owned(),
        };
        Self::new(ErrorCode::NoModel, message)
    }

    /// [`ErrorCode::LoadFailed`]: a `load` failed for reason `kind`.
    pub fn load_failed(kind: LoadErrorKind, detail: impl Into<String>) -> Self {
        let data = LoadFailedData {
            kind,
            detail: detail.into(),
        };
        Self::new(
            ErrorCode::LoadFailed,
            format!("model load failed ({}): {}", kind.as_str(), data.detail),
        )
        .with_data(data)
    }

    /// [`ErrorCode::Busy`]: the queue already holds `max_queue` requests.
    pub fn busy(max_queue: usize) -> Self {
        Self::new(
            ErrorCode::Busy,
            format!("busy: {max_queue} requests are already queued; retry when one finishes"),
        )
        .with_data(BusyData { max_queue })
    }

    /// [`ErrorCode::ContextOverflow`]: the prompt has more tokens than the context allows.
    pub fn context_overflow(prompt_tokens: u64, context_length: u64) -> Self {
        Self::new(
            ErrorCode::ContextOverflow,
            format!(
                "context overflow: the prompt has {prompt_tokens} tokens and the context limit is \
                 {context_length}; shorten the prompt or load with a larger max_seq_length"
            ),
        )
        .with_data(ContextOverflowData {
            prompt_tokens,
            context_length,
        })
    }

    /// [`ErrorCode::MemoryBudget`]: the request does not fit the memory MLX has left; `message`
    /// says what it needs, what is left and what to do.
    pub fn memory_budget(message: impl Into<String>, data: MemoryBudgetData) -> Self {
        Self::new(ErrorCode::MemoryBudget, message).with_data(data)
    }

    /// [`ErrorCode::GenerationFailed`]: MLX failed while generating.
    pub fn generation_failed(detail: impl Into<String>) -> Self {
        let data = GenerationFailedData {
            detail: detail.into(),
        };
        Self::new(
            ErrorCode::GenerationFailed,
            format!("generation failed: {}", data.detail),
        )
        .with_data(data)
    }

    /// [`ErrorCode::RequestCancelled`]: the request was cancelled before it ran.
    pub fn request_cancelled() -> Self {
        Self::new(
            ErrorCode::RequestCancelled,
            "request cancelled before it ran",
        )
    }
}

// The doc comments of the `data` types below are their descriptions in `schema.json`, for
// hosts, so they name the code by its number; `tests/schema.rs` checks that each names its own.

/// `data` of `-32602 invalid params`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InvalidParamsData {
    /// The JSON path of the bad field, e.g. `temperature` or `messages[1].content`; `.` for the
    /// params as a whole.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Why a model failed to load: `data.kind` of `-32002`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadErrorKind {
    /// No such repo, directory or file.
    NotFound,
    /// The model's architecture has no implementation in the worker.
    UnsupportedArchitecture,
    /// Weights are missing, truncated, or do not match the config.
    InvalidWeights,
    /// No usable tokenizer next to the weights.
    TokenizerMissing,
    /// The hub wants a token (gated or private repo); pass `hf_token`.
    AuthRequired,
    /// The hub could not be reached.
    Network,
    /// Not enough memory for the weights.
    OutOfMemory,
    /// A GGUF file with a layout or quantization the worker cannot read.
    GgufUnsupported,
}

impl LoadErrorKind {
    /// The name on the wire, e.g. `"not_found"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LoadErrorKind::NotFound => "not_found",
            LoadErrorKind::UnsupportedArchitecture => "unsupported_architecture",
            LoadErrorKind::InvalidWeights => "invalid_weights",
            LoadErrorKind::TokenizerMissing => "tokenizer_missing",
            LoadErrorKind::AuthRequired => "auth_required",
            LoadErrorKind::Network => "network",
            LoadErrorKind::OutOfMemory => "out_of_memory",
            LoadErrorKind::GgufUnsupported => "gguf_unsupported",
        }
    }
}

/// `data` of `-32002 model load failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LoadFailedData {
    /// The class of failure.
    pub kind: LoadErrorKind,
    /// The underlying error, for people.
    pub detail: String,
}

/// `data` of `-32003 busy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BusyData {
    /// The queue's capacity (`--max-queue`).
    pub max_queue: usize,
}

/// `data` of `-32004 context overflow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContextOverflowData {
    /// Tokens in the templated prompt.
    pub prompt_tokens: u64,
    /// The context limit of the model as loaded.
    pub context_length: u64,
}

/// `data` of `-32006 memory budget`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryBudgetData {
    /// Tokens in the templated prompt.
    pub prompt_tokens: u64,
    /// Tokens (prompt and answer together) whose KV cache and activations fit what is left.
    pub tokens_that_fit: u64,
    /// Bytes of KV cache and activations the prompt and one answer token need.
    pub needed_bytes: u64,
    /// Bytes MLX has left under its memory limit.
    pub available_bytes: u64,
}

/// `data` of `-32005 generation failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GenerationFailedData {
    /// The MLX error, for people.
    pub detail: String,
}
