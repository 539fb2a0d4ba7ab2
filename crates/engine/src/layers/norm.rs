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

/// Layer normalisation with a learned scale and offset (`mx.fast.layer_norm`): vision towers.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Array,
    pub bias: Array,
    pub eps: f32,
}

impl LayerNorm {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::layer_norm(x, Some(&self.weight), Some(&self.bias), self.eps)
    }
}
