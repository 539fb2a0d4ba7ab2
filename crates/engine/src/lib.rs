//! The inference library over mlx-rs: model files (one per architecture), weights and
//! quantization, KV cache, sampler, and the generation loop. No JSON-RPC in here: the worker
//! turns protocol messages into the calls below.
//!
//! MLX is used from one thread: an [`Engine`] lives on the worker's MLX thread and every call
//! below runs there. What other threads need while a generation runs (a resident model's
//! tokenizer for `tokenize`, a [`CancelToken`]) is `Send + Sync`.

mod attention;
mod batch;
mod cancel;
mod constrained;
mod device;
mod distributed;
mod engine;
mod error;
mod fused;
mod generate;
mod kv_cache;
mod load;
mod lora;
mod memory;
mod models;
mod nn;
mod prompt;
mod prompt_cache;
mod quantized;
mod request;
mod rope;
mod sampler;
#[cfg(test)]
mod stream_error_tests;
mod vision;
mod weights;

pub use batch::{Admission, BatchAttention, More};
pub use cancel::CancelToken;
pub use distributed::{Backend as DistributedBackend, Group};
pub use engine::{Engine, Loaded};
pub use error::{EngineError, LoadErrorKind};
pub use prompt_cache::DEFAULT_PROMPT_CACHE_BYTES;
pub use request::*;
pub use text;
