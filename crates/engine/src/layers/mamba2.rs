//! Mamba2, the state-space layer of Nemotron-H and Granite 4.0 hybrids (mlx-lm's
//! `NemotronHMamba2Mixer`, `GraniteMoeHybridMamba2Mixer` and `ssm.py`): the input projected to
//! a gate, the convolution's input and one time step per head; a causal depthwise convolution
//! (its last `kernel - 1` inputs cached) and SiLU; its output split into the heads' inputs `x`
//! and the state's input and output mixings `B`, `C` (one per group of heads); the selective
//! scan, whose `(heads, head_dim, state)` state is cached; a gated RMS norm; the output
//! projection.
//!
//! The scan is mlx-lm's `ssm_attn` (the path it takes off Apple GPUs, so on this MLX build the
//! reference, decode steps included): chunks of [`SCAN_STEP`] positions, each a masked
//! "attention" `tril(C Bᵀ * exp(segsum(dt A)))` over the chunk plus the state carried in; same
//! ops, same order, same dtypes (time steps and state in f32), so the sums round alike.

use mlx_rs::{
    fast,
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};

use serde_json::Value;
use text::python_json::python_float;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::StateCache,
    layers::weights::Weights,
    layers::{array::scalar_like, array::Result, linear::Linear},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// Positions per chunk of the scan (mlx-lm's `step`).
const SCAN_STEP: i32 = 256;

/// How the output is gated and normalised: `silu(gate) * y` RMS-normed per group of heads with
/// the weight applied after (Nemotron-H's `MambaRMSNormGated`) or over every head at once
/// (Granite's; Falcon-H1's with `mamba_rms_norm`); normed first, then gated (Falcon-H1's
/// `mamba_norm_before_gate`); or gated only (Falcon-H1's default, no `norm` weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedNorm {
    PerGroup,
    Whole,
    WholeThenGate,
    GateOnly,
}

/// A Mamba2 layer's sizes, from config.json.
#[derive(Debug, Clone)]
pub struct Mamba2Spec {
    pub num_heads: i32,
    pub head_dim: i32,
    pub n_groups: i32,
    pub state_size: i32,
    pub conv_kernel: i32,
    pub norm_eps: f32,
    pub norm: GatedNorm,
    /// Time steps are clipped to `[min, max]` after their softplus.
    pub time_step_limit: (f32, f32),
    /// The skip connection `D` in its stored dtype (Falcon-H1), not the input's (so a float32
    /// `D` makes a float32 output).
    pub d_as_stored: bool,
}

/// config.json's `time_step_limit` (`[min, max]`, Python's `Infinity` allowed; `default` when
/// absent), as every Mamba2 family reads it.
pub fn time_step_limit(given: Option<&[Value]>, default: (f32, f32)) -> LoadResult<(f32, f32)> {
    let Some(limit) = given else {
        return Ok(default);
    };
    let values: Option<Vec<f64>> = limit.iter().map(python_float).collect();
    match values.as_deref() {
        Some(&[lo, hi]) if lo <= hi => Ok((lo as f32, hi as f32)),
        _ => Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("config.json: `time_step_limit` is {limit:?}, not [min, max]"),
        )),
    }
}

impl Mamba2Spec {
    fn inner(&self) -> i32 {
        self.num_heads * self.head_dim
    }

    fn conv_dim(&self) -> i32 {
        self.inner() + 2 * self.n_groups * self.state_size
    }
}

pub struct Mamba2 {
    /// `hidden -> inner + conv_dim + heads`: gate, convolution input, time steps.
    in_proj: Linear,
    /// `(conv_dim, kernel, 1)`, MLX's layout (one group per channel).
    conv_weight: Array,
    conv_bias: Option<Array>,
    dt_bias: Array,
    a_log: Array,
    d: Array,
    /// `None` for [`GatedNorm::GateOnly`].
    norm_weight: Option<Array>,
    out_proj: Linear,
    spec: Mamba2Spec,
}

impl Mamba2 {
    /// The layer at `prefix` (`model.layers.N.mixer`).
    pub fn load(weights: &mut Weights, prefix: &str, spec: Mamba2Spec) -> LoadResult<Self> {
        let p = |name: &str| format!("{prefix}.{name}");
        let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
        let s = &spec;
        if s.num_heads < 1 || s.head_dim < 1 || s.state_size < 1 || s.conv_kernel < 2 {
            return Err(invalid(format!(
                "config.json: a Mamba2 layer of {} heads of {}, state {} and {} convolution \
                 taps (need at least one head, one feature, one state entry and two taps)",
                s.num_heads, s.head_dim, s.state_size, s.conv_kernel
            )));
        }
        if s.n_groups < 1 || s.num_heads % s.n_groups != 0 {
            return Err(invalid(format!(
                "config.json: {} Mamba2 heads in {} groups (the groups must divide the heads)",
                s.num_heads, s.n_groups
            )));
        }
        let in_proj = weights.linear(&p("in_proj"))?;
        let out_proj = weights.linear(&p("out_proj"))?;
        let conv_weight = weights.take(&p("conv1d.weight"))?;
        // Hugging Face stores `(channels, 1, kernel)`; mlx-lm's sanitize moves the kernel axis.
        let conv_weight = match conv_weight.ndim() == 3 && conv_weight.dim(-1) != 1 {
            true => conv_weight.swap_axes(1, 2)?,
            false => conv_weight,
        };
        let per_head = |name: &str, w: Array| match w.shape() == [s.num_heads] {
            true => Ok(w),
            false => Err(invalid(format!(
                "`{}` is {:?}, not one value per head ({})",
                p(name),
                w.shape(),
                s.num_heads
            ))),
        };
        let dt_bias = per_head("dt_bias", weights.take(&p("dt_bias"))?)?;
        let a_log = per_head("A_log", weights.take(&p("A_log"))?)?;
        let d = per_head("D", weights.take(&p("D"))?)?;
        let norm_weight = match s.norm {
            GatedNorm::GateOnly => None,
            _ => Some(weights.take(&p("norm.weight"))?),
        };
        let layer = Self {
            in_proj,
            conv_weight,
            conv_bias: weights.remove(&p("conv1d.bias")),
            dt_bias,
            a_log,
            d,
            norm_weight,
            out_proj,
            spec,
        };
        layer.check_shapes(prefix)?;
        Ok(layer)
    }

    /// Refuses weights config.json does not describe (MLX would fail mid-forward, or not at
    /// all on a split that silently takes other widths).
    fn check_shapes(&self, prefix: &str) -> LoadResult<()> {
        let s = &self.spec;
        let (inner, conv_dim) = (s.inner(), s.conv_dim());
        let norm = self.norm_weight.as_ref().map_or(inner, |w| w.dim(-1));
        let checks = [
            (
                "in_proj",
                self.in_proj.dims().0,
                inner + conv_dim + s.num_heads,
            ),
            ("out_proj", self.out_proj.dims().1, inner),
            ("norm.weight", norm, inner),
        ];
        for (name, got, want) in checks {
            if got != want {
                return Err(EngineError::load(
                    LoadErrorKind::InvalidWeights,
                    format!(
                        "`{prefix}.{name}` is {got} wide but config.json implies {want}: \
                         config.json does not describe these weights"
                    ),
                ));
            }
        }
        let expected = [conv_dim, s.conv_kernel, 1];
        if self.conv_weight.shape() != expected {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "`{prefix}.conv1d.weight` is {:?} but config.json implies {expected:?}",
                    self.conv_weight.shape()
                ),
            ));
        }
        Ok(())
    }

    /// `(B, S, hidden)` -> `(B, S, hidden)`, carrying the convolution window and the state in
    /// `cache` from one call (prefill chunk or decode step) to the next.
    pub fn forward(&self, x: &Array, cache: &mut StateCache) -> Result<Array> {
        let s = &self.spec;
        let (b, len) = (x.dim(0), x.dim(1));
        let (inner, conv_dim) = (s.inner(), s.conv_dim());
        let projected = self.in_proj.forward(x)?;
        let [gate, conv_input, dt] =
            three(projected.split_at_indices(&[inner, inner + conv_dim], -1)?);

        let conv = cache.convolve(&conv_input, &self.conv_weight, self.conv_bias.as_ref())?;
        let conv = conv.multiply(ops::sigmoid(&conv)?)?;

        let mixing = s.n_groups * s.state_size;
        let [hidden, b_mix, c_mix] = three(conv.split_at_indices(&[inner, inner + mixing], -1)?);
        let hidden = hidden.reshape(&[b, len, s.num_heads, s.head_dim])?;
        let b_mix = b_mix.reshape(&[b, len, s.n_groups, s.state_size])?;
        let c_mix = c_mix.reshape(&[b, len, s.n_groups, s.state_size])?;
        let d = match s.d_as_stored {
            true => self.d.clone(),
            false => self.d.as_dtype(hidden.dtype())?,
        };
        let scan = Scan {
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            d: &d,
            limit: s.time_step_limit,
        };
        let state = cache.state.take();
        let (y, state) = scan.run(&hidden, &b_mix, &c_mix, &dt, state, cache.step_states())?;
        cache.state = Some(state);
        cache.advance(len);

        let y = y.reshape(&[b, len, inner])?;
        self.out_proj.forward(&self.gated_norm(&y, &gate)?)
    }

    /// The output gated and normed as [`GatedNorm`] says.
    fn gated_norm(&self, y: &Array, gate: &Array) -> Result<Array> {
        let s = &self.spec;
        let gated = |y: &Array| gate.multiply(ops::sigmoid(gate)?)?.multiply(y);
        let weight = self.norm_weight.as_ref();
        match s.norm {
            GatedNorm::GateOnly => gated(y),
            GatedNorm::Whole => fast::rms_norm(&gated(y)?, weight, s.norm_eps),
            GatedNorm::WholeThenGate => gated(&fast::rms_norm(y, weight, s.norm_eps)?),
            GatedNorm::PerGroup => {
                let group = s.inner() / s.n_groups;
                let grouped = ops::unflatten(&gated(y)?, -1, &[-1, group])?;
                let normed = fast::rms_norm(&grouped, None, s.norm_eps)?;
                let weight = weight.expect("loaded for this norm");
                weight.multiply(normed.flatten(-2, -1)?)
            }
        }
    }

    /// The linear layers under their checkpoint names (relative to `mamba.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("in_proj", &mut self.in_proj),
            ("out_proj", &mut self.out_proj),
        ]
    }
}

/// The scan's per-head parameters.
struct Scan<'a> {
    a_log: &'a Array,
    dt_bias: &'a Array,
    /// The skip connection's weight, in the input's dtype.
    d: &'a Array,
    limit: (f32, f32),
}

impl Scan<'_> {
    /// mlx-lm's `ssm_attn`: `x` `(b, l, h, dh)`, `b_mix`/`c_mix` `(b, l, g, n)`, `dt` `(b, l,
    /// h)`, the state carried in `(b, h, dh, n)` (f32) or none. Returns `y` `(b, l, h, dh)` in
    /// `x`'s dtype and the state after the last position. With `steps`, one position per chunk
    /// (as decode steps run), and `steps` gets the state after each.
    fn run(
        &self,
        x: &Array,
        b_mix: &Array,
        c_mix: &Array,
        dt: &Array,
        mut state: Option<Array>,
        mut steps: Option<&mut Vec<Array>>,
    ) -> Result<(Array, Array)> {
        let (b, l, h) = (x.dim(0), x.dim(1), x.dim(2));
        // mlx-lm's `compute_dt`: softplus(dt + bias) in f32, clipped.
        let dt = dt.as_dtype(Dtype::Float32)?.add(self.dt_bias)?;
        let dt = ops::logaddexp(&dt, scalar_like(0.0, &dt)?)?;
        let (lo, hi) = self.limit;
        let dt = ops::clip(&dt, (scalar_like(lo, &dt)?, scalar_like(hi, &dt)?))?;
        let a = ops::exp(self.a_log)?.as_dtype(dt.dtype())?.negative()?;
        let dt_a = dt.multiply(a.reshape(&[1, 1, -1])?)?;
        let dtx = dt.reshape(&[b, l, h, 1])?.multiply(x)?;
        let mut ys = Vec::new();
        let mut start = 0;
        while start < l {
            let chunk_len = if steps.is_some() { 1 } else { SCAN_STEP };
            let end = (start + chunk_len).min(l);
            let chunk = |t: &Array| t.index((.., start..end));
            let (y, next) = step(
                &chunk(&dtx),
                &chunk(&dt_a),
                &chunk(b_mix),
                &chunk(c_mix),
                state.as_ref(),
                x.dtype(),
            )?;
            ys.push(y);
            if let Some(steps) = steps.as_deref_mut() {
                steps.push(next.clone());
            }
            state = Some(next);
            start = end;
        }
        let y = ops::concatenate(&ys, 1)?;
        let y = y.add(x.multiply(self.d.reshape(&[1, 1, h, 1])?)?)?;
        Ok((y, state.expect("at least one position")))
    }
}

/// One chunk of the scan (mlx-lm's `_step`): `dtx` `(b, s, h, dh)` and `dt_a` `(b, s, h)` in
/// f32, the mixings `(b, s, g, n)`, the state carried in.
fn step(
    dtx: &Array,
    dt_a: &Array,
    b_mix: &Array,
    c_mix: &Array,
    state: Option<&Array>,
    dtype: Dtype,
) -> Result<(Array, Array)> {
    let (b, s, h, dh) = (dtx.dim(0), dtx.dim(1), dtx.dim(2), dtx.dim(3));
    let (g, n) = (b_mix.dim(2), b_mix.dim(3));
    let repeats = h / g;
    let b_t = b_mix.transpose_axes(&[0, 2, 3, 1])?;
    let cb = c_mix.swap_axes(1, 2)?.matmul(&b_t)?;
    let cb = ops::repeat_axis::<f32>(cb, repeats, 1)?;
    let decay = ops::exp(segsum(&dt_a.swap_axes(1, 2)?)?)?;
    let surrogate = ops::tril(cb.multiply(&decay)?, 0)?;
    let mut y = surrogate.matmul(dtx.swap_axes(1, 2)?)?.swap_axes(1, 2)?;

    let last = decay.index((.., .., -1.., ..));
    let last = last.transpose_axes(&[0, 3, 1, 2])?;
    let b_heads = ops::repeat_axis::<f32>(b_t, repeats, 1)?.swap_axes(2, 3)?;
    let dtx_decay = dtx.multiply(&last)?.swap_axes(1, 2)?.swap_axes(2, 3)?;
    let mut next = dtx_decay.matmul(&b_heads)?;

    if let Some(state) = state {
        let cum = ops::exp(ops::cumsum(dt_a, -2, None, None)?)?;
        let carried = cum.index((.., -1, ..)).reshape(&[b, h, 1, 1])?;
        next = next.add(carried.multiply(state)?)?;
        let c6 = c_mix.reshape(&[b, s, g, 1, n, 1])?;
        let prev = state.reshape(&[b, 1, g, repeats, dh, n])?.matmul(&c6)?;
        let prev = prev.squeeze_axes(&[-1])?.flatten(2, 3)?;
        y = y.add(cum.expand_dims(-1)?.multiply(&prev)?)?;
    }
    Ok((y.as_dtype(dtype)?, next))
}

/// mlx-lm's `segsum` without a mask: `(..., l)` -> `(..., l, l)`, entry `[i, j]` the sum of
/// `x[j + 1..=i]` (zero on and above the diagonal).
fn segsum(x: &Array) -> Result<Array> {
    let l = x.dim(-1);
    let x = ops::repeat_axis::<f32>(x.expand_dims(-1)?, l, -1)?;
    let x = ops::tril(&x, -1)?;
    ops::cumsum(&x, -2, None, None)
}

fn three(parts: Vec<Array>) -> [Array; 3] {
    parts
        .try_into()
        .expect("split at two indices gives three parts")
}
