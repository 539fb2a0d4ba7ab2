//! RoPE variants chosen by config.json's `rope_scaling`, as mlx-lm's `initialize_rope` does.

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    nn::{Rope, RotaryAngles},
};

/// Builds the rotary embedding a config asks for: default, `linear`, `llama3`, `yarn` or
/// `proportional` (Gemma 4's partial rotation).
pub fn rope_from_config(
    dims: i32,
    base: f32,
    traditional: bool,
    scaling: Option<&Value>,
    _max_position_embeddings: Option<usize>,
) -> Result<Rope, EngineError> {
    let rope_type = scaling
        .and_then(|s| s.get("type").or_else(|| s.get("rope_type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        scaling
            .and_then(|s| s.get("factor"))
            .and_then(Value::as_f64)
            .unwrap_or(1.0)
    };
    let plain = |scale: f32| Rope {
        dims,
        traditional,
        base,
        scale,
        freqs: None,
        input_scale: None,
    };
    match rope_type {
        "default" => Ok(plain(1.0)),
        "linear" => Ok(plain(1.0 / factor() as f32)),
        "llama3" => {
            let s = scaling.expect("llama3 scaling has a config");
            let get = |k: &str, d: f64| s.get(k).and_then(Value::as_f64).unwrap_or(d);
            let freqs = llama3_freqs(
                dims,
                base as f64,
                factor(),
                get("low_freq_factor", 1.0),
                get("high_freq_factor", 4.0),
                get("original_max_position_embeddings", 8192.0),
            );
            Ok(Rope {
                freqs: Some(Array::from_slice(&freqs, &[freqs.len() as i32])),
                ..plain(1.0)
            })
        }
        "yarn" => {
            let s = scaling.expect("yarn scaling has a config");
            let get = |k: &str, d: f64| s.get(k).and_then(Value::as_f64).unwrap_or(d);
            let yarn = Yarn {
                factor: factor(),
                original_max_position_embeddings: get("original_max_position_embeddings", 4096.0),
                beta_fast: get("beta_fast", 32.0),
                beta_slow: get("beta_slow", 1.0),
                mscale: get("mscale", 1.0),
                mscale_all_dim: get("mscale_all_dim", 0.0),
            };
            yarn.rope(dims, base, traditional)
        }
        "proportional" => {
            let s = scaling.expect("proportional scaling has a config");
            let partial = s
                .get("partial_rotary_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0);
            proportional(
                dims,
                (dims as f64 * partial) as i32,
                base,
                factor(),
                traditional,
            )
        }
        other => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "rope_scaling type `{other}` is not supported (default, linear, llama3, yarn, \
                 proportional are)"
            ),
        )),
    }
}

/// A frequency table computed with MLX's f32 ops (as mlx-lm does, so that it is bit-equal),
/// with MLX's errors as load errors.
fn mlx_freqs(f: impl FnOnce() -> crate::nn::Result<Array>) -> Result<Array, EngineError> {
    f().map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, e.to_string()))
}

/// `base^(2i / dims)` for the first `rotated` of `dims` features, float32.
fn wavelengths(rotated: i32, dims: i32, base: f32) -> crate::nn::Result<Array> {
    let exponents = Array::arange::<f32, f32>(0.0, rotated as f32, 2.0)?
        .divide(Array::from_f32(dims as f32))?;
    ops::power(Array::from_f32(base), &exponents)
}

/// YaRN as mlx-lm's `YarnRoPE`: frequencies blended between interpolated (`factor` times) and
/// original by a linear ramp over the correction range of `beta_fast`..`beta_slow` rotations,
/// and the rotated features scaled by `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`.
struct Yarn {
    factor: f64,
    original_max_position_embeddings: f64,
    beta_fast: f64,
    beta_slow: f64,
    mscale: f64,
    mscale_all_dim: f64,
}

impl Yarn {
    fn rope(&self, dims: i32, base: f32, traditional: bool) -> Result<Rope, EngineError> {
        let d = dims as f64;
        let correction_dim = |rotations: f64| {
            d * (self.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI))
                .ln()
                / (2.0 * (base as f64).ln())
        };
        let low = correction_dim(self.beta_fast).floor().max(0.0);
        let high = correction_dim(self.beta_slow).ceil().min(d - 1.0);
        // mlx-lm nudges an empty ramp to avoid dividing by zero.
        let high = if low == high { high + 0.001 } else { high };
        let get_mscale = |m: f64| match self.factor <= 1.0 {
            true => 1.0,
            false => 0.1 * m * self.factor.ln() + 1.0,
        };
        let mscale = get_mscale(self.mscale) / get_mscale(self.mscale_all_dim);
        let freqs = mlx_freqs(|| {
            let extra = wavelengths(dims, dims, base)?;
            let inter = Array::from_f32(self.factor as f32).multiply(&extra)?;
            let ramp = Array::arange::<f32, f32>(0.0, (dims / 2) as f32, 1.0)?
                .subtract(Array::from_f32(low as f32))?
                .divide(Array::from_f32((high - low) as f32))?;
            let ramp = ops::clip(&ramp, (&Array::from_f32(0.0), &Array::from_f32(1.0)))?;
            let one = Array::from_f32(1.0);
            let mask = one.subtract(&ramp)?;
            inter.multiply(&extra)?.divide(
                inter
                    .multiply(&mask)?
                    .add(extra.multiply(one.subtract(&mask)?)?)?,
            )
        })?;
        Ok(Rope {
            dims,
            traditional,
            base,
            scale: 1.0,
            freqs: Some(freqs),
            input_scale: (mscale != 1.0).then_some(mscale as f32),
        })
    }
}

/// mlx-lm's `ProportionalRoPE` (Gemma 4's global layers): the first `rotated` features turn
/// with frequencies `factor * base^(2i / dims)` (exponents over the whole head), the rest get
/// infinite wavelengths, so they do not turn.
fn proportional(
    dims: i32,
    rotated: i32,
    base: f32,
    factor: f64,
    traditional: bool,
) -> Result<Rope, EngineError> {
    if rotated > dims || rotated < 0 {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "config.json: partial_rotary_factor gives {rotated} rotated features of {dims}; \
                 it must be between 0 and 1"
            ),
        ));
    }
    let freqs = mlx_freqs(|| {
        let turning = Array::from_f32(factor as f32).multiply(wavelengths(rotated, dims, base)?)?;
        let still = ops::full::<f32>(&[(dims - rotated) / 2], Array::from_f32(f32::INFINITY))?;
        ops::concatenate(&[turning, still], 0)
    })?;
    Ok(Rope {
        dims,
        traditional,
        base,
        scale: 1.0,
        freqs: Some(freqs),
        input_scale: None,
    })
}

/// Llama 3's frequency-dependent scaling of the rotary wavelengths.
fn llama3_freqs(dims: i32, base: f64, factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..dims)
        .step_by(2)
        .map(|i| {
            let freq = base.powf(i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI * freq;
            let scaled = if wavelen > low_wavelen {
                freq * factor
            } else {
                freq
            };
            if wavelen > high_wavelen && wavelen < low_wavelen {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (scaled / ((1.0 - smooth) / factor + smooth)) as f32
            } else {
                scaled as f32
            }
        })
        .collect()
}

/// Phi-3's su/longrope RoPE as mlx-lm implements it: the long factors always (whatever the
/// sequence length), and the rotated features scaled by `long_mscale`, else by
/// `sqrt(1 + ln(f) / ln(original))` where `f = max / original` exceeds 1.
pub fn su_scaled(
    dims: i32,
    base: f32,
    max_position_embeddings: usize,
    original_max_position_embeddings: usize,
    long_factor: &[f32],
    long_mscale: Option<f64>,
) -> Result<Rope, EngineError> {
    if long_factor.len() != (dims / 2) as usize {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "config.json: rope_scaling.long_factor has {} values; {} rotated dims need {}",
                long_factor.len(),
                dims,
                dims / 2
            ),
        ));
    }
    let freqs = mlx_freqs(|| {
        let long = Array::from_slice(long_factor, &[long_factor.len() as i32]);
        long.multiply(wavelengths(dims, dims, base)?)
    })?;
    let original = original_max_position_embeddings as f64;
    let factor = max_position_embeddings as f64 / original;
    let mscale = long_mscale.unwrap_or(if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / original.ln()).sqrt()
    });
    Ok(Rope {
        dims,
        traditional: false,
        base,
        scale: 1.0,
        freqs: Some(freqs),
        input_scale: (mscale != 1.0).then_some(mscale as f32),
    })
}

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
        let inv_freq = || -> crate::nn::Result<Array> {
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
    pub fn angles(
        &self,
        positions: &Array,
        dtype: mlx_rs::Dtype,
    ) -> crate::nn::Result<RotaryAngles> {
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
    pub fn slice(&self, start: usize, n: usize) -> crate::nn::Result<Array> {
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
