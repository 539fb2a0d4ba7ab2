//! End-to-end tests of mlx-worker: the real binary over real pipes, real MLX, real weights (tiny
//! random models written by `fixtures`, the real SmolLM2 and Gemma 3 270M). One
//! test binary, one module per area; `support` holds what they share.

mod support;

mod batch;
mod constrain;
mod conversations;
mod disk_cache;
mod faults;
mod fuzz;
mod gemma3;
mod generate;
mod group;
mod hub;
mod lora;
mod memory;
mod prompt_cache;
mod queue;
mod smollm2;
mod soak;
mod speculative;
mod vision;
mod wire;
