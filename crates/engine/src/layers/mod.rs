//! The first floor: layers every model is built from, each computing exactly what mlx-lm's
//! layer of the same name computes (greedy decoding is token for token equal). Nothing here
//! knows a model family, a request or the runtime (`floors_tests.rs` keeps it so).

pub mod activation;
pub mod adapter;
pub mod array;
pub mod attention;
pub mod device;
pub mod distributed;
pub mod embedding;
pub mod gated_delta;
pub mod kimi_delta;
pub mod kv_cache;
pub mod laurel;
pub mod linear;
pub mod lora;
pub mod mamba;
pub mod mamba2;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod mrope;
pub mod norm;
pub mod parallel;
pub mod quantized;
pub mod rope;
pub mod sdpa;
pub mod short_conv;
pub mod weights;

pub use activation::{gelu, gelu_approx, quick_gelu, Activation};
pub use array::{row, scalar_like, soft_cap, Result};
pub use attention::{
    Attention, AttentionShape, QkNorm, QkNormOver, Qkv, QueryTemperature, TemperatureForm,
};
pub use embedding::Embedding;
pub use linear::Linear;
pub use mlp::{GateUp, GatedMlp};
pub use norm::{LayerNorm, Norm, RmsNorm};

pub use rope::{rotate_half, Rope, RotaryAngles};
