//! The gated delta-net, the linear-attention layer of hybrid models (Qwen3-Next, Qwen3.5):
//! projections to queries, keys, values, an output gate `z` and the per-head decay and write
//! strengths (`a`, `b`); a causal depthwise convolution over q/k/v whose last inputs are cached;
//! q/k L2-normalised; then the gated delta rule, a recurrence over a `(Dv, Dk)` state per value
//! head; a gated RMS norm; the output projection.
//!
//! The recurrence is written with MLX ops, one step per token, as mlx-lm's `gated_delta_ops` (the
//! path it takes off the GPU, so on this MLX build the reference): same ops, same order, same
//! dtypes (state in f32), so the sums round alike.

use mlx_rs::{
    fast,
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::StateCache,
    layers::weights::Weights,
    layers::{
        array::scalar_like,
        array::Result,
        linear::{check_dims, Linear},
        norm::RmsNorm,
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// How a checkpoint stores the input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaProjections {
    /// `in_proj_qkvz` and `in_proj_ba`, rows grouped by key head (Qwen3-Next).
    Grouped,
    /// `in_proj_qkv` (all q, then k, then v), `in_proj_z`, `in_proj_b`, `in_proj_a` (Qwen3.5).
    Separate,
}

/// The input projections of a layer.
enum Projections {
    Grouped {
        in_proj_qkvz: Linear,
        in_proj_ba: Linear,
    },
    Separate {
        in_proj_qkv: Linear,
        in_proj_z: Linear,
        in_proj_b: Linear,
        in_proj_a: Linear,
    },
}

/// A gated delta-net layer's sizes (config.json's `linear_*` fields).
#[derive(Debug, Clone)]
pub struct GatedDeltaSpec {
    pub projections: DeltaProjections,
    pub num_k_heads: i32,
    pub num_v_heads: i32,
    pub head_k_dim: i32,
    pub head_v_dim: i32,
    pub conv_kernel: i32,
    pub rms_norm_eps: f32,
}

impl GatedDeltaSpec {
    fn key_dim(&self) -> i32 {
        self.num_k_heads * self.head_k_dim
    }

    /// Channels of the convolution: q, k and v side by side.
    fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.num_v_heads * self.head_v_dim
    }
}

pub struct GatedDeltaNet {
    projections: Projections,
    /// `(conv_dim, kernel, 1)`, MLX's layout (one group per channel).
    conv1d: Array,
    a_log: Array,
    dt_bias: Array,
    /// Over each value head's features, then gated by `silu(z)`.
    norm: RmsNorm,
    out_proj: Linear,
    spec: GatedDeltaSpec,
}

impl GatedDeltaNet {
    /// The layer at `prefix` (`model.layers.N.linear_attn`).
    pub fn load(weights: &mut Weights, prefix: &str, spec: GatedDeltaSpec) -> LoadResult<Self> {
        let s = &spec;
        if s.num_k_heads < 1 || s.num_v_heads % s.num_k_heads != 0 || s.conv_kernel < 1 {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "config.json: {} value heads must be a multiple of {} key heads, and the \
                     convolution kernel ({}) at least 1",
                    s.num_v_heads, s.num_k_heads, s.conv_kernel
                ),
            ));
        }
        let p = |name: &str| format!("{prefix}.{name}");
        let conv1d = weights.take(&p("conv1d.weight"))?;
        // Hugging Face stores `(channels, 1, kernel)`; mlx-lm's sanitize moves the kernel axis.
        let conv1d = match conv1d.dim(-1) {
            1 => conv1d,
            _ => conv1d.swap_axes(1, 2)?,
        };
        let expected = [s.conv_dim(), s.conv_kernel, 1];
        if conv1d.shape() != expected {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "`{}` is {:?} but config.json implies {expected:?}: config.json does not \
                     describe these weights",
                    p("conv1d.weight"),
                    conv1d.shape()
                ),
            ));
        }
        let mut linear = |name: &str| weights.linear(&p(name));
        let projections = match s.projections {
            DeltaProjections::Grouped => Projections::Grouped {
                in_proj_qkvz: linear("in_proj_qkvz")?,
                in_proj_ba: linear("in_proj_ba")?,
            },
            DeltaProjections::Separate => Projections::Separate {
                in_proj_qkv: linear("in_proj_qkv")?,
                in_proj_z: linear("in_proj_z")?,
                in_proj_b: linear("in_proj_b")?,
                in_proj_a: linear("in_proj_a")?,
            },
        };
        let layer = Self {
            projections,
            conv1d,
            a_log: weights.take(&p("A_log"))?,
            dt_bias: weights.take(&p("dt_bias"))?,
            norm: weights.rms_norm(&p("norm"), s.rms_norm_eps)?,
            out_proj: weights.linear(&p("out_proj"))?,
            spec,
        };
        layer.check_shapes(prefix)?;
        Ok(layer)
    }

    /// Refuses projections of other sizes than config.json implies (they would fail, or compute
    /// garbage, in the middle of a forward pass).
    fn check_shapes(&self, prefix: &str) -> LoadResult<()> {
        let s = &self.spec;
        let (value_dim, hidden) = (s.num_v_heads * s.head_v_dim, self.out_proj.dims().0);
        let mut expected = vec![("out_proj", &self.out_proj, (hidden, value_dim))];
        match &self.projections {
            Projections::Grouped {
                in_proj_qkvz,
                in_proj_ba,
            } => {
                let qkvz = 2 * s.key_dim() + 2 * value_dim;
                expected.push(("in_proj_qkvz", in_proj_qkvz, (qkvz, hidden)));
                expected.push(("in_proj_ba", in_proj_ba, (2 * s.num_v_heads, hidden)));
            }
            Projections::Separate {
                in_proj_qkv,
                in_proj_z,
                in_proj_b,
                in_proj_a,
            } => {
                expected.push(("in_proj_qkv", in_proj_qkv, (s.conv_dim(), hidden)));
                expected.push(("in_proj_z", in_proj_z, (value_dim, hidden)));
                expected.push(("in_proj_b", in_proj_b, (s.num_v_heads, hidden)));
                expected.push(("in_proj_a", in_proj_a, (s.num_v_heads, hidden)));
            }
        }
        let sizes = format!(
            "{} key heads of {}, {} value heads of {}",
            s.num_k_heads, s.head_k_dim, s.num_v_heads, s.head_v_dim
        );
        check_dims(prefix, &expected, &sizes)
    }

    /// `(B, S, hidden)` -> `(B, S, hidden)`, carrying the convolution window and the state in
    /// `cache` from the previous call (prefill chunk or decode step) to the next.
    pub fn forward(&self, x: &Array, cache: &mut StateCache) -> Result<Array> {
        let s = &self.spec;
        let (b, len) = (x.dim(0), x.dim(1));
        let (nk, dk, nv, dv) = (s.num_k_heads, s.head_k_dim, s.num_v_heads, s.head_v_dim);
        let (mixed, z, beta_in, a) = match &self.projections {
            Projections::Grouped {
                in_proj_qkvz,
                in_proj_ba,
            } => {
                // Rows are grouped by key head: [q, k, v, z] of each, then [b, a] of each.
                let per_k = nv / nk;
                let qkvz = in_proj_qkvz.forward(x)?.reshape(&[b, len, nk, -1])?;
                let split = [dk, 2 * dk, 2 * dk + per_k * dv];
                let [q, k, v, z] = four(qkvz.split_at_indices(&split, -1)?);
                let ba = in_proj_ba.forward(x)?.reshape(&[b, len, nk, -1])?;
                let mut ba = ba.split_at_indices(&[per_k], -1)?.into_iter();
                let (beta_in, a) = (ba.next().unwrap(), ba.next().unwrap());
                let flat = |t: &Array| t.reshape(&[b, len, -1]);
                let mixed = ops::concatenate(&[flat(&q)?, flat(&k)?, flat(&v)?], -1)?;
                let per_head = |t: Array| t.reshape(&[b, len, nv]);
                (mixed, z, per_head(beta_in)?, per_head(a)?)
            }
            Projections::Separate {
                in_proj_qkv,
                in_proj_z,
                in_proj_b,
                in_proj_a,
            } => (
                in_proj_qkv.forward(x)?,
                in_proj_z.forward(x)?,
                in_proj_b.forward(x)?,
                in_proj_a.forward(x)?,
            ),
        };
        let z = z.reshape(&[b, len, nv, dv])?;

        let conv = cache.convolve(&mixed, &self.conv1d, None)?;
        let conv = conv.multiply(ops::sigmoid(&conv)?)?;

        let key_dim = s.key_dim();
        let [q, k, v] = three(conv.split_at_indices(&[key_dim, 2 * key_dim], -1)?);
        let q = q.reshape(&[b, len, nk, dk])?;
        let k = k.reshape(&[b, len, nk, dk])?;
        let v = v.reshape(&[b, len, nv, dv])?;
        let (q, k) = normalize_qk(&q, &k, dk)?;

        let beta = ops::sigmoid(&beta_in)?;
        let g = decay(&self.a_log, &a, &self.dt_bias)?;
        let state = match cache.state.take() {
            Some(state) => state,
            None => ops::zeros_dtype(&[b, nv, dv, dk], Dtype::Float32)?,
        };
        let (out, state) = recurrence(q, k, &v, &g, &beta, state, cache.step_states())?;
        cache.state = Some(state);
        cache.advance(len);

        let out = self.gated_norm(&out, &z)?;
        self.out_proj.forward(&out.reshape(&[b, len, -1])?)
    }

    /// mlx-lm's `Qwen3NextRMSNormGated` with a gate: `silu(z) * rms_norm(x)`, in f32, back in
    /// `x`'s dtype.
    fn gated_norm(&self, x: &Array, z: &Array) -> Result<Array> {
        let normed = self.norm.forward(x)?.as_dtype(Dtype::Float32)?;
        let z = z.as_dtype(Dtype::Float32)?;
        let gate = z.multiply(ops::sigmoid(&z)?)?;
        gate.multiply(&normed)?.as_dtype(x.dtype())
    }

    /// The linear layers under their checkpoint names (relative to `linear_attn.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = match &mut self.projections {
            Projections::Grouped {
                in_proj_qkvz,
                in_proj_ba,
            } => vec![("in_proj_qkvz", in_proj_qkvz), ("in_proj_ba", in_proj_ba)],
            Projections::Separate {
                in_proj_qkv,
                in_proj_z,
                in_proj_b,
                in_proj_a,
            } => vec![
                ("in_proj_qkv", in_proj_qkv),
                ("in_proj_z", in_proj_z),
                ("in_proj_b", in_proj_b),
                ("in_proj_a", in_proj_a),
            ],
        };
        out.push(("out_proj", &mut self.out_proj));
        out
    }
}

fn four(parts: Vec<Array>) -> [Array; 4] {
    parts
        .try_into()
        .expect("split at three indices gives four parts")
}

fn three(parts: Vec<Array>) -> [Array; 3] {
    parts
        .try_into()
        .expect("split at two indices gives three parts")
}

/// mlx-lm's `normalize_qk`: q and k L2-normalised (as RMS norms with the eps scaled to match),
/// the readout scale `dk^-0.5` folded into q. Python's float arithmetic, in f64, rounded once.
pub(crate) fn normalize_qk(q: &Array, k: &Array, dk: i32) -> Result<(Array, Array)> {
    let inv_scale = (dk as f64).powf(-0.5);
    let eps = (1e-6 * inv_scale.powi(2)) as f32;
    let q = scalar_like(inv_scale.powi(2) as f32, q)?.multiply(fast::rms_norm(q, None, eps)?)?;
    let k = scalar_like(inv_scale as f32, k)?.multiply(fast::rms_norm(k, None, eps)?)?;
    Ok((q, k))
}

/// The per-token decay `exp(-exp(A_log) * softplus(a + dt_bias))` (mlx-lm's `compute_g`), in
/// f32: per head, or (Kimi's) per head and key feature.
pub(crate) fn decay(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let x = a.add(dt_bias)?;
    let softplus = ops::logaddexp(&x, scalar_like(0.0, &x)?)?;
    let rate = ops::exp(a_log.as_dtype(Dtype::Float32)?)?.negative()?;
    ops::exp(rate.multiply(&softplus)?)
}

/// The gated delta rule over `T` tokens, one step at a time (mlx-lm's `gated_delta_ops`):
/// q, k `(B, T, Hk, Dk)`, v `(B, T, Hv, Dv)`, beta `(B, T, Hv)`, g `(B, T, Hv)` (a decay per
/// head) or `(B, T, Hv, Dk)` (per key feature, Kimi's), state `(B, Hv, Dv, Dk)`. Returns y
/// `(B, T, Hv, Dv)` in q's dtype and the new state; `steps` (when given) gets the state after
/// each token.
pub(crate) fn recurrence(
    q: Array,
    k: Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
    mut steps: Option<&mut Vec<Array>>,
) -> Result<(Array, Array)> {
    let repeat = v.dim(-2) / k.dim(-2);
    let (q, k) = match repeat {
        1 => (q, k),
        r => (
            ops::repeat_axis::<f32>(q, r, -2)?,
            ops::repeat_axis::<f32>(k, r, -2)?,
        ),
    };
    let mut ys = Vec::with_capacity(q.dim(1) as usize);
    for t in 0..q.dim(1) {
        let (qt, kt) = (q.index((.., t)), k.index((.., t)).expand_dims(-2)?);
        let (vt, gt, bt) = (v.index((.., t)), g.index((.., t)), beta.index((.., t)));
        let gt = match g.ndim() {
            4 => gt.expand_dims(-2)?,
            _ => gt.expand_dims(-1)?.expand_dims(-1)?,
        };
        state = state.multiply(gt)?;
        let kv_mem = state.multiply(&kt)?.sum_axis(-1, false)?;
        let delta = vt.subtract(&kv_mem)?.multiply(bt.expand_dims(-1)?)?;
        state = state.add(kt.multiply(delta.expand_dims(-1)?)?)?;
        if let Some(steps) = steps.as_deref_mut() {
            steps.push(state.clone());
        }
        let y = state.multiply(qt.expand_dims(-2)?)?.sum_axis(-1, false)?;
        ys.push(y.as_dtype(q.dtype())?);
    }
    Ok((ops::stack(&ys, 1)?, state))
}
