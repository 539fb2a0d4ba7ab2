//! Kimi Delta Attention (KDA), the linear attention of Kimi Linear (mlx-lm's
//! `KimiDeltaAttention`): queries, keys and values each through its own projection and causal
//! depthwise convolution (then SiLU); q/k L2-normalised; the gated delta rule of
//! [`gated_delta`](super::gated_delta) with a decay per head *and key feature* (from a low-rank
//! `f_a_proj`/`f_b_proj`), write strengths from `b_proj`; the output RMS-normed per head and
//! gated by a sigmoid of a low-rank `g_a_proj`/`g_b_proj`; the output projection.
//!
//! mlx-lm convolves q, k and v separately, each with its cached window; here they run as one
//! convolution of the three side by side, one window in the [`StateCache`]: a depthwise
//! convolution treats each channel alone, and MLX gives the same bits either way (checked by
//! the parity fixtures).

use mlx_rs::{ops, Array, Dtype};

use crate::{
    error::EngineError,
    layers::gated_delta::{decay, normalize_qk, recurrence},
    layers::kv_cache::StateCache,
    layers::weights::{invalid, Weights},
    layers::{
        array::Result,
        linear::{check_dims, Linear},
        norm::RmsNorm,
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// A KDA layer's sizes (config.json's `linear_attn_config`).
#[derive(Debug, Clone)]
pub struct KdaSpec {
    pub num_heads: i32,
    pub head_dim: i32,
    pub conv_kernel: i32,
    pub rms_norm_eps: f32,
}

pub struct KimiDelta {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    /// The q, k and v convolutions' weights side by side, `(3 * heads * head_dim, kernel, 1)`.
    conv: Array,
    f_a_proj: Linear,
    f_b_proj: Linear,
    b_proj: Linear,
    g_a_proj: Linear,
    g_b_proj: Linear,
    /// `(heads, 1)`.
    a_log: Array,
    /// `(heads, head_dim)`.
    dt_bias: Array,
    o_norm: RmsNorm,
    o_proj: Linear,
    spec: KdaSpec,
}

impl KimiDelta {
    /// The layer at `prefix` (`model.layers.N.self_attn`), in mlx-lm's names or Hugging Face's
    /// (`q_conv1d` as `(channels, 1, kernel)`, which mlx-lm's sanitize turns to `q_conv.conv`).
    pub fn load(weights: &mut Weights, prefix: &str, spec: KdaSpec) -> LoadResult<Self> {
        let s = &spec;
        let (h, d, kernel) = (s.num_heads, s.head_dim, s.conv_kernel);
        if h < 1 || d < 1 || kernel < 1 {
            return Err(invalid(format!(
                "config.json: linear_attn_config's num_heads ({h}), head_dim ({d}) and \
                 short_conv_kernel_size ({kernel}) must be at least 1"
            )));
        }
        let p = |name: &str| format!("{prefix}.{name}");
        let mut convs = Vec::with_capacity(3);
        for part in ["q", "k", "v"] {
            let ours = p(&format!("{part}_conv.conv.weight"));
            let conv = match weights.remove(&ours) {
                Some(conv) => conv,
                None => weights
                    .take(&p(&format!("{part}_conv1d.weight")))?
                    .swap_axes(1, 2)?,
            };
            if conv.shape() != [h * d, kernel, 1] {
                return Err(invalid(format!(
                    "`{ours}` is {:?} but config.json implies {:?}: config.json does not \
                     describe these weights",
                    conv.shape(),
                    [h * d, kernel, 1]
                )));
            }
            convs.push(conv);
        }
        let per_head = |name: &str, a: Array, shape: &[i32]| -> LoadResult<Array> {
            match a.size() as i32 == shape.iter().product::<i32>() {
                true => Ok(a.reshape(shape)?),
                false => Err(invalid(format!(
                    "`{}` holds {} values but config.json implies {shape:?}",
                    p(name),
                    a.size()
                ))),
            }
        };
        let a_log = per_head("A_log", weights.take(&p("A_log"))?, &[h, 1])?;
        let dt_bias = per_head("dt_bias", weights.take(&p("dt_bias"))?, &[h, d])?;
        let mut linear = |name: &str| weights.linear(&p(name));
        let layer = Self {
            q_proj: linear("q_proj")?,
            k_proj: linear("k_proj")?,
            v_proj: linear("v_proj")?,
            conv: ops::concatenate(&convs, 0)?,
            f_a_proj: linear("f_a_proj")?,
            f_b_proj: linear("f_b_proj")?,
            b_proj: linear("b_proj")?,
            g_a_proj: linear("g_a_proj")?,
            g_b_proj: linear("g_b_proj")?,
            o_proj: linear("o_proj")?,
            o_norm: weights.rms_norm(&p("o_norm"), s.rms_norm_eps)?,
            a_log,
            dt_bias,
            spec,
        };
        layer.check_shapes(prefix)?;
        Ok(layer)
    }

    /// Refuses projections of other sizes than config.json implies.
    fn check_shapes(&self, prefix: &str) -> LoadResult<()> {
        let (h, d) = (self.spec.num_heads, self.spec.head_dim);
        let hidden = self.o_proj.dims().0;
        let expected = [
            ("q_proj", &self.q_proj, (h * d, hidden)),
            ("k_proj", &self.k_proj, (h * d, hidden)),
            ("v_proj", &self.v_proj, (h * d, hidden)),
            ("f_a_proj", &self.f_a_proj, (d, hidden)),
            ("f_b_proj", &self.f_b_proj, (h * d, d)),
            ("b_proj", &self.b_proj, (h, hidden)),
            ("g_a_proj", &self.g_a_proj, (d, hidden)),
            ("g_b_proj", &self.g_b_proj, (h * d, d)),
            ("o_proj", &self.o_proj, (hidden, h * d)),
        ];
        check_dims(prefix, &expected, &format!("{h} heads of {d}"))
    }

    /// `(B, S, hidden)` -> `(B, S, hidden)`, carrying the convolution window and the state in
    /// `cache` from the previous call to the next.
    pub fn forward(&self, x: &Array, cache: &mut StateCache) -> Result<Array> {
        let (h, d) = (self.spec.num_heads, self.spec.head_dim);
        let (b, len) = (x.dim(0), x.dim(1));
        let projected = [&self.q_proj, &self.k_proj, &self.v_proj]
            .map(|p| p.forward(x))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        let conv = cache.convolve(&ops::concatenate(&projected, -1)?, &self.conv, None)?;
        let conv = conv.multiply(ops::sigmoid(&conv)?)?;
        let heads = |t: &Array| t.reshape(&[b, len, h, d]);
        let parts = conv.split_equal(3, -1)?;
        let (q, k) = normalize_qk(&heads(&parts[0])?, &heads(&parts[1])?, d)?;
        let v = heads(&parts[2])?;

        let a = heads(&self.f_b_proj.forward(&self.f_a_proj.forward(x)?)?)?;
        let g = decay(&self.a_log, &a, &self.dt_bias)?;
        let beta = ops::sigmoid(&self.b_proj.forward(x)?)?;
        let state = match cache.state.take() {
            Some(state) => state,
            None => ops::zeros_dtype(&[b, h, d, d], Dtype::Float32)?,
        };
        let (out, state) = recurrence(q, k, &v, &g, &beta, state, cache.step_states())?;
        cache.state = Some(state);
        cache.advance(len);

        let gate = heads(&self.g_b_proj.forward(&self.g_a_proj.forward(x)?)?)?;
        let out = self.o_norm.forward(&out)?.multiply(ops::sigmoid(&gate)?)?;
        self.o_proj.forward(&out.reshape(&[b, len, -1])?)
    }

    /// The linear layers under their checkpoint names (relative to `self_attn.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("q_proj", &mut self.q_proj),
            ("k_proj", &mut self.k_proj),
            ("v_proj", &mut self.v_proj),
            ("f_a_proj", &mut self.f_a_proj),
            ("f_b_proj", &mut self.f_b_proj),
            ("b_proj", &mut self.b_proj),
            ("g_a_proj", &mut self.g_a_proj),
            ("g_b_proj", &mut self.g_b_proj),
            ("o_proj", &mut self.o_proj),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn a_convolution_of_another_shape_is_refused_by_name() {
        let _mlx = fixtures::mlx_test_lock();
        let spec = KdaSpec {
            num_heads: 2,
            head_dim: 8,
            conv_kernel: 4,
            rms_norm_eps: 1e-5,
        };
        let zeros = |shape: &[i32]| ops::zeros::<f32>(shape).unwrap();
        let p = "model.layers.0.self_attn";
        let mut tensors = HashMap::new();
        tensors.insert(format!("{p}.q_conv.conv.weight"), zeros(&[16, 4, 1]));
        // Three taps where config.json says four.
        tensors.insert(format!("{p}.k_conv1d.weight"), zeros(&[16, 1, 3]));
        let mut weights = Weights::from_tensors(tensors, &json!({}));
        let err = match KimiDelta::load(&mut weights, p, spec) {
            Ok(_) => panic!("loaded a damaged convolution"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("k_conv.conv.weight") && err.contains("[16, 4, 1]"),
            "{err}"
        );
    }
}
