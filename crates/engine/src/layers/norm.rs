//! RMS and layer normalisation.

use mlx_rs::{fast, Array};

use crate::layers::array::Result;

/// RMS normalisation with a learned scale: `weight` is the scale applied (a family that stores
/// its norms differently converts them once at load, see `models::decoder::Family`).
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

/// Layer normalisation with a learned scale and, where the checkpoint has one, an offset
/// (`mx.fast.layer_norm`): vision towers, Cohere's decoders.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Array,
    pub bias: Option<Array>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::layer_norm(x, Some(&self.weight), self.bias.as_ref(), self.eps)
    }
}

/// A decoder block's or its final norm: RMS (most families) or layer normalisation (Cohere).
#[derive(Debug)]
pub enum Norm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

impl Norm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Norm::Rms(n) => n.forward(x),
            Norm::Layer(n) => n.forward(x),
        }
    }
}
