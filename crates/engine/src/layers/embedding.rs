//! Token embeddings, and the tied output head.

use mlx_rs::Array;

use crate::layers::{array::Result, linear::Linear};

/// Token embedding; doubles as the output head when embeddings are tied.
#[derive(Debug)]
pub struct Embedding {
    /// The table, as a linear layer of shape (vocab, hidden).
    pub table: Linear,
}

impl Embedding {
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.table.quantized {
            Some(q) => q.dequantize_rows(&self.table.weight, ids),
            None => self.table.weight.take_axis(ids, 0),
        }
    }

    /// Logits from hidden states: `h E^T`.
    pub fn as_linear(&self, h: &Array) -> Result<Array> {
        self.table.forward(h)
    }
}
