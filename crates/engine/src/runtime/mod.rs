//! The top floor: what runs a request. Resident models and their load (`engine.rs`,
//! `load.rs`), the scheduler that steps generations together (`scheduler.rs`), a generation's
//! loop (`generate/`), sampling, prompts and the prompt cache (its disk tier: `disk_cache.rs`), constraints,
//! memory and what a model costs in it (`footprint.rs`), cancellation, and the engine's plain request and answer types (`request.rs`).

#[cfg(test)]
mod batching_tests;
pub mod cancel;
pub mod constrained;
pub mod disk_cache;
pub mod engine;
pub mod footprint;
#[cfg(test)]
mod footprint_tests;
pub mod generate;
pub mod image_features;
pub mod load;
pub mod memory;
#[cfg(test)]
mod moe_load_tests;
pub mod prepare;
pub mod prompt;
pub mod prompt_cache;
pub mod request;
pub mod resident;
pub mod sampler;
pub mod scheduler;
#[cfg(test)]
mod stream_error_tests;
