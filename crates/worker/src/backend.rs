//! What the worker needs from an inference engine, in protocol terms.
//!
//! The executor drives one [`Backend`] on the MLX thread. Mapping protocol params to engine
//! types and engine errors to protocol error codes happens in the backend that wraps the engine
//! (one place), so the transport, dispatcher and queue never see an engine type.
//!
//! Backends in this crate:
//! - `unavailable::Unavailable`: the default build until `crates/engine` exposes `Engine`; it answers every
//!   engine call with `-32603` saying how to get a real one.
//! - `fake_backend::FakeBackend` (feature `fake-engine`): scripted, MLX-free, for the tests.
//!
//! TODO(engine): `engine_backend.rs` (feature `mlx`) wrapping `mlx_engine::Engine`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use protocol::methods::{
    GenerateParams, GenerateResult, LoadParams, LoadResult, LoadStage, MemoryInfo, MlxInfo,
    ResetResult, ResidentModel, TokenLogprob, TokenizeParams, TokenizeResult, UnloadParams,
    UnloadResult,
};
use protocol::ResponseError;

/// A flag the dispatcher sets and the engine polls between prefill chunks and decode steps.
pub trait CancelSignal: Clone + Send + Sync + 'static {
    /// A flag that is not set.
    fn new() -> Self;
    /// Sets the flag.
    fn cancel(&self);
    /// Whether the flag is set.
    #[cfg_attr(
        not(feature = "fake-engine"),
        allow(dead_code, reason = "polled by engine backends")
    )]
    fn is_cancelled(&self) -> bool;
}

/// The worker's own cancellation flag, for backends without a token type of their own.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelSignal for CancelFlag {
    fn new() -> Self {
        Self::default()
    }
    fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What `initialize` reports about the engine and device; fixed for the process's life.
#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// MLX version, backend and device.
    pub mlx: MlxInfo,
    /// `model_type`s the engine can load.
    pub architectures: Vec<String>,
    /// Image inputs supported.
    pub vision: bool,
    /// LoRA adapters supported.
    pub lora: bool,
    /// GGUF files supported.
    pub gguf: bool,
}

/// Resident models and memory, as `status` reports them.
#[derive(Debug, Clone, Default)]
pub struct Residents {
    /// The model `generate` uses by default.
    pub active_model: Option<String>,
    /// Every resident model.
    pub models: Vec<ResidentModel>,
    /// MLX memory.
    pub memory: MemoryInfo,
}

/// Tokenization that may run on any thread while the MLX thread generates.
pub trait TokenizeService: Send + Sync {
    /// Tokenizes `params.text`, or `params.messages` through the chat template.
    fn tokenize(&self, params: &TokenizeParams) -> Result<TokenizeResult, ResponseError>;
}

/// An inference engine, driven from the MLX thread only.
pub trait Backend: 'static {
    /// The cancellation flag the engine polls.
    type Cancel: CancelSignal;

    /// What `initialize` reports.
    fn info(&self) -> BackendInfo;
    /// A handle for `tokenize`, usable from other threads.
    fn tokenizer(&self) -> Arc<dyn TokenizeService>;
    /// Loads a model; `progress(stage, done, total, message)` reports as it goes.
    fn load(
        &mut self,
        params: &LoadParams,
        cancel: &Self::Cancel,
        progress: &mut dyn FnMut(LoadStage, u64, u64, String),
    ) -> Result<LoadResult, ResponseError>;
    /// Generates; `on_delta(text, tokens)` gets only the text new since the last call. When
    /// `cancel` is set the result has `finish_reason: cancelled` and the text so far.
    fn generate(
        &mut self,
        params: &GenerateParams,
        cancel: &Self::Cancel,
        on_delta: &mut dyn FnMut(String, Option<Vec<TokenLogprob>>),
    ) -> Result<GenerateResult, ResponseError>;
    /// Unloads one model or all.
    fn unload(&mut self, params: &UnloadParams) -> Result<UnloadResult, ResponseError>;
    /// Clears MLX's buffer cache and any prompt cache.
    fn reset(&mut self) -> Result<ResetResult, ResponseError>;
    /// Resident models and memory now.
    fn residents(&self) -> Residents;
    /// Frees every model and MLX's cache before the process exits.
    fn free(&mut self);
}
