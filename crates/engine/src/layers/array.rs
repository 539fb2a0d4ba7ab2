//! What every layer file shares: MLX's error type, a batch's rows, scalars in an array's dtype.

use mlx_rs::{ops, ops::indexing::IndexOp, Array};

/// The result of an MLX computation.
pub type Result<T> = std::result::Result<T, mlx_rs::error::Exception>;

/// Row `b` of a batch `x` `(B, ...)`, as `(1, ...)`: a view, no copy (no kernel on a GPU).
pub fn row(x: &Array, b: usize) -> Array {
    let b = b as i32;
    x.index(b..b + 1)
}

/// Every row of a batch `x` `(B, ...)`, each `(1, ...)`, as [`row`] gives them.
pub fn split_rows(x: &Array) -> Vec<Array> {
    (0..x.dim(0) as usize).map(|b| row(x, b)).collect()
}

/// A scalar in `like`'s dtype. Python scalars are weakly typed in MLX (`x * 0.5` keeps a bf16
/// `x` bf16); an mlx-rs scalar is an f32 array and would promote, so cast it first.
pub fn scalar_like(v: f32, like: &Array) -> Result<Array> {
    Array::from_f32(v).as_dtype(like.dtype())
}

/// Logits soft-capped at `cap`: `tanh(x / cap) * cap`, the cap in the logits' dtype.
pub fn soft_cap(logits: Array, cap: Option<f32>) -> Result<Array> {
    let Some(cap) = cap else {
        return Ok(logits);
    };
    let cap = scalar_like(cap, &logits)?;
    ops::tanh(logits.divide(&cap)?)?.multiply(&cap)
}
