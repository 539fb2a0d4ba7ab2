//! Multimodal RoPE (Qwen-VL): rotary angles from explicit `(3, L)` positions.

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::error::{EngineError, LoadErrorKind};
use crate::layers::{array::Result as MlxResult, rope::RotaryAngles};

/// How M-RoPE assigns the rotary frequencies to the three position rows (mlx-vlm's `style`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MropeStyle {
    /// Qwen2-VL/Qwen2.5-VL: the first `sections[0]` frequencies turn with the temporal id, the
    /// next `sections[1]` with the height id, the rest with the width id.
    Chunked,
    /// Qwen3-VL: frequency `i` turns with the height id when `i % 3 == 1` and `i < 3 *
    /// sections[1]`, the width id when `i % 3 == 2` and `i < 3 * sections[2]`, else the temporal.
    Interleaved,
}

/// Multimodal RoPE (the Qwen-VL language models), as mlx-vlm 0.7.0 computes it off Metal
/// (`MRoPERotaryEmbedding`): each position has three ids (temporal, height, width), and each
/// rotary frequency turns with the one its [`MropeStyle`] picks. The angles are computed
/// with MLX ops (not `fast::rope`), cos/sin cast to the activations' dtype, and applied as
/// `x * cos + rotate_half(x) * sin` ([`RotaryAngles`]).
#[derive(Debug)]
pub struct MRope {
    /// `1 / base^(2i / head_dim)`, float32.
    inv_freq: Array,
    /// For each frequency, which of the three position rows turns it.
    selector: Array,
}

impl MRope {
    pub fn new(
        head_dim: i32,
        base: f32,
        sections: &[i32],
        style: MropeStyle,
    ) -> Result<Self, EngineError> {
        let freqs = head_dim / 2;
        if sections.len() != 3 || sections.iter().any(|&s| s < 0) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!("config.json: mrope_section must be three counts, got {sections:?}"),
            ));
        }
        // mlx-vlm's `_chunked_position_selector` / `_interleaved_position_selector`: sections
        // past `freqs` are cut off.
        let mut selector = vec![0i32; freqs as usize];
        match style {
            MropeStyle::Chunked => {
                let mut start = sections[0];
                for (row, &len) in sections.iter().enumerate().skip(1) {
                    for i in start.min(freqs)..(start + len).min(freqs) {
                        selector[i as usize] = row as i32;
                    }
                    start += len;
                }
            }
            MropeStyle::Interleaved => {
                for (row, &len) in sections.iter().enumerate().skip(1) {
                    for i in (row as i32..(len * 3).min(freqs)).step_by(3) {
                        selector[i as usize] = row as i32;
                    }
                }
            }
        }
        let inv_freq = || -> MlxResult<Array> {
            let exponents = Array::arange::<f32, f32>(0.0, head_dim as f32, 2.0)?
                .divide(Array::from_f32(head_dim as f32))?;
            Array::from_f32(1.0).divide(ops::power(Array::from_f32(base), &exponents)?)
        };
        let inv_freq = inv_freq()
            .map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, e.to_string()))?;
        Ok(Self {
            inv_freq,
            selector: Array::from_slice(&selector, &[freqs]),
        })
    }

    /// The angles for `positions` `(3, L)` int32 (rows t, h, w) in `dtype`.
    pub fn angles(&self, positions: &Array, dtype: mlx_rs::Dtype) -> MlxResult<RotaryAngles> {
        let l = positions.dim(1);
        // (F, L) -> (1, L, F): each frequency's position, times the frequency.
        let chosen = positions.take_axis(&self.selector, 0)?;
        let freqs = chosen
            .transpose_axes(&[1, 0])?
            .reshape(&[1, l, -1])?
            .as_dtype(mlx_rs::Dtype::Float32)?
            .multiply(&self.inv_freq)?;
        let emb = ops::concatenate(&[&freqs, &freqs], -1)?.expand_dims(1)?;
        Ok(RotaryAngles {
            cos: emb.cos()?.as_dtype(dtype)?,
            sin: emb.sin()?.as_dtype(dtype)?,
        })
    }
}

/// `rope_scaling.mrope_section` of a Qwen-VL language model, as mlx-vlm's `TextConfig`s check
/// it (absent: `[24, 20, 20]`).
pub fn mrope_section(scaling: Option<&Value>) -> Result<Vec<i32>, EngineError> {
    let Some(s) = scaling.filter(|s| !s.is_null()) else {
        return Ok(vec![24, 20, 20]);
    };
    let kind = s
        .get("type")
        .or_else(|| s.get("rope_type"))
        .and_then(Value::as_str);
    if !matches!(kind, Some("mrope" | "default")) {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!("rope_scaling type {kind:?} is not supported for Qwen-VL (mrope, default are)"),
        ));
    }
    serde_json::from_value(s.get("mrope_section").cloned().unwrap_or(Value::Null)).map_err(|_| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: rope_scaling.mrope_section must list three integers",
        )
    })
}

/// The M-RoPE position ids of a whole prompt, `(3, L)` rows (temporal, height, width), and the
/// `delta` every later token adds to its index: a pure function of the prompt's ids and image
/// grids, so a prompt-cache reuse takes the slice it has not prefilled and decoding continues
/// from it (mlx-vlm's `get_rope_index` and `rope_deltas`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MropePositions {
    pub rows: [Vec<i32>; 3],
    pub delta: i32,
}

impl MropePositions {
    /// Positions `(3, n)` of the tokens at indices `start..start + n`: the prompt's own, then
    /// `index + delta` on all three rows.
    pub fn slice(&self, start: usize, n: usize) -> MlxResult<Array> {
        let len = self.rows[0].len();
        let mut out = Vec::with_capacity(3 * n);
        for row in &self.rows {
            out.extend((start..start + n).map(|i| match i < len {
                true => row[i],
                false => i as i32 + self.delta,
            }));
        }
        Ok(Array::from_slice(&out, &[3, n as i32]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_style_gives_the_frequencies_their_position_rows() {
        let rows = |style| {
            let m = MRope::new(32, 1e6, &[6, 5, 5], style).unwrap();
            m.selector.as_slice::<i32>().to_vec()
        };
        // Qwen2/2.5-VL: 6 temporal, 5 height, 5 width, in runs.
        let chunked = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2];
        assert_eq!(rows(MropeStyle::Chunked), chunked);
        // Qwen3-VL: t, h, w in turn while the height and width sections last.
        let interleaved = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0];
        assert_eq!(rows(MropeStyle::Interleaved), interleaved);
        // The real [24, 20, 20] over 64 frequencies: the last four are temporal.
        let m = MRope::new(128, 5e6, &[24, 20, 20], MropeStyle::Interleaved).unwrap();
        let s = m.selector.as_slice::<i32>().to_vec();
        assert_eq!(&s[57..], [0, 1, 2, 0, 0, 0, 0]);
    }
}
