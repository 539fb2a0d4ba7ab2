//! Gemma 3n's learned augmented residual (LAuReL, mlx-lm's `Gemma3nLaurelBlock`): a low-rank
//! path beside attention, `x + norm(right(left(x)))`.

use mlx_rs::Array;

use crate::layers::{array::Result, linear::Linear, norm::RmsNorm, weights::Weights};

type LoadResult<T> = std::result::Result<T, crate::error::EngineError>;

pub struct Laurel {
    pub linear_left: Linear,
    pub linear_right: Linear,
    pub post_laurel_norm: RmsNorm,
}

impl Laurel {
    /// `linear_left`, `linear_right` and `post_laurel_norm` under `prefix` (`...laurel`).
    /// `left` must map the hidden state to the rank, `right` back.
    pub fn load(weights: &mut Weights, prefix: &str, eps: f32) -> LoadResult<Self> {
        let linear_left = weights.linear(&format!("{prefix}.linear_left"))?;
        let linear_right = weights.linear(&format!("{prefix}.linear_right"))?;
        let ((rank, hidden), right) = (linear_left.dims(), linear_right.dims());
        if right != (hidden, rank) {
            return Err(crate::error::EngineError::load(
                crate::error::LoadErrorKind::InvalidWeights,
                format!(
                    "{prefix}.linear_right is {right:?}, but linear_left is ({rank}, {hidden}): \
                     it must be ({hidden}, {rank})"
                ),
            ));
        }
        Ok(Self {
            linear_left,
            linear_right,
            post_laurel_norm: weights.rms_norm(&format!("{prefix}.post_laurel_norm"), eps)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let low = self.linear_right.forward(&self.linear_left.forward(x)?)?;
        x.add(self.post_laurel_norm.forward(&low)?)
    }

    /// The linear layers under their names relative to `laurel.`.
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("linear_left", &mut self.linear_left),
            ("linear_right", &mut self.linear_right),
        ]
    }
}
