//! Rotary position embeddings: the layer, and the variants config.json's `rope_scaling` asks
//! for, as mlx-lm's `initialize_rope` builds them.

use mlx_rs::{fast, ops, Array};
use serde_json::Value;

use crate::error::{EngineError, LoadErrorKind};
use crate::layers::{array::scalar_like, array::Result as MlxResult};

/// Rotary position embedding over the first `dims` features of each head.
#[derive(Debug, Clone)]
pub struct Rope {
    pub dims: i32,
    pub traditional: bool,
    pub base: f32,
    pub scale: f32,
    /// Custom frequencies (Llama 3, Phi-3 su/longrope); replaces `base` when present.
    pub freqs: Option<Array>,
    /// Phi-3's su/longrope attention factor: the rotated features are multiplied by it before
    /// the rotation. `None` when it is 1 (multiplying by 1 changes nothing).
    pub input_scale: Option<f32>,
}

impl Rope {
    pub fn forward(&self, x: &Array, offset: i32) -> MlxResult<Array> {
        let x = self.scale_input(x)?;
        let (base, freqs) = self.frequencies();
        fast::rope(
            &x,
            self.dims,
            self.traditional,
            base,
            self.scale,
            offset,
            freqs,
        )
    }

    /// [`Self::forward`] for a batch `x` `(B, H, L, D)` whose row `b` starts at `offsets[b]`
    /// (`(B,)` int32): one rotation for all rows, each as it is alone.
    pub fn forward_rows(&self, x: &Array, offsets: &Array) -> MlxResult<Array> {
        let x = self.scale_input(x)?;
        let (base, freqs) = self.frequencies();
        fast::rope_dynamic(
            &x,
            self.dims,
            self.traditional,
            base,
            self.scale,
            offsets,
            freqs,
        )
    }

    fn scale_input(&self, x: &Array) -> MlxResult<Array> {
        match self.input_scale {
            Some(s) => scale_leading(x, self.dims, s),
            None => Ok(x.clone()),
        }
    }

    /// `base`, or the custom frequencies that replace it.
    fn frequencies(&self) -> (Option<f32>, Option<&Array>) {
        match &self.freqs {
            Some(f) => (None, Some(f)),
            None => (Some(self.base), None),
        }
    }
}

/// Rotary angles given per position rather than by a cache offset (M-RoPE, `mrope.rs`):
/// `cos` and `sin` `(B, 1, L, head_dim)` in the activations' dtype, applied over whole heads as
/// mlx-vlm's `apply_multimodal_rotary_pos_emb` does: `x * cos + rotate_half(x) * sin`, in
/// `x`'s dtype.
pub struct RotaryAngles {
    pub cos: Array,
    pub sin: Array,
}

impl RotaryAngles {
    /// `x` `(B, H, L, head_dim)` rotated.
    pub fn rotate(&self, x: &Array) -> MlxResult<Array> {
        x.multiply(&self.cos)?
            .add(rotate_half(x)?.multiply(&self.sin)?)?
            .as_dtype(x.dtype())
    }
}

/// `[-x2, x1]` of the two halves of the last axis.
pub fn rotate_half(x: &Array) -> MlxResult<Array> {
    let half = x.dim(-1) / 2;
    let parts = x.split_at_indices(&[half], -1)?;
    ops::concatenate(&[parts[1].negative()?, parts[0].clone()], -1)
}

/// `x[..., :dims] * s`, the rest of the last axis unchanged (mlx-lm: `x.at[...,
/// :dims].multiply(s)`).
fn scale_leading(x: &Array, dims: i32, s: f32) -> MlxResult<Array> {
    let s = scalar_like(s, x)?;
    if dims == x.dim(-1) {
        return x.multiply(&s);
    }
    let parts = x.split_at_indices(&[dims], -1)?;
    ops::concatenate(&[parts[0].multiply(&s)?, parts[1].clone()], -1)
}

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
fn mlx_freqs(f: impl FnOnce() -> MlxResult<Array>) -> Result<Array, EngineError> {
    f().map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, e.to_string()))
}

/// `base^(2i / dims)` for the first `rotated` of `dims` features, float32.
fn wavelengths(rotated: i32, dims: i32, base: f32) -> MlxResult<Array> {
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
