//! The decoder-only transformer every architecture file here builds: embedding, blocks of
//! attention and gated MLP with RMS norms, final norm, head. A model file reads its config.json
//! into a [`LayerSpec`] per layer (what differs between families: fused projections, q/k norms,
//! norm placement, activation, attention window, RoPE or none, gated or linear attention) and
//! calls [`Decoder::load`] with its tensor names and its [`Family`]: the few computations a
//! family does its own way (Gemma's `1 + w` norms, scaled embeddings, clipped residuals), kept in
//! the family's file.
//!
//! As in mlx-lm's model files, each forward pass builds one attention mask per kind of layer
//! (full attention, and each sliding window) and hands every layer the mask of its kind.

mod block;
mod family;
mod forward;
mod load;
mod model;
mod mtp;
mod parallel;
mod spec;

pub use family::{Family, Llama};
pub use load::{load_layers, load_uniform, sanitize};
pub use model::Decoder;
pub use spec::{AttentionKind, CommonArgs, DecoderSpec, LayerSpec, LlamaArgs, MlpSpec, NormLayout};
