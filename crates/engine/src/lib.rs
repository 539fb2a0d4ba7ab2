//! The inference library over mlx-rs, in three floors, each importing only from the floors
//! below it (`floors_tests.rs` checks it):
//!
//! - `layers/`: what every model is built from (linear and quantized weights, embeddings,
//!   norms, RoPE, attention, activations, MLPs and MoE experts, linear attention, KV cache kinds,
//!   adapters, checkpoint reading, devices and the distributed primitives);
//! - `models/` (language models: the shared decoder and one file per family) and `vision/`
//!   (vision towers and how a vision model wraps its language model);
//! - `runtime/`: resident models, load, the scheduler, generation, sampling, prompts and their
//!   cache, constraints, memory.
//!
//! `error.rs` is below them all. No JSON-RPC in here: the worker turns protocol messages into
//! the calls below.
//!
//! MLX is used from one thread: an [`Engine`] lives on the worker's MLX thread and every call
//! below runs there. What other threads need while a generation runs (a resident model's
//! tokenizer for `tokenize`, a [`CancelToken`]) is `Send + Sync`.

mod error;
mod layers;
mod models;
mod runtime;
mod vision;

#[cfg(test)]
mod floors_tests;

pub use error::{EngineError, LoadErrorKind};
pub use layers::distributed::{Backend as DistributedBackend, Group};
pub use runtime::cancel::CancelToken;
pub use runtime::disk_cache::{DiskCounts, DiskSettings};
pub use runtime::engine::{Engine, Loaded};
pub use runtime::memory::stats as memory_stats;
pub use runtime::prompt_cache::DEFAULT_PROMPT_CACHE_BYTES;
pub use runtime::request::*;
pub use runtime::scheduler::{Admission, BatchAttention, More};
pub use text;
