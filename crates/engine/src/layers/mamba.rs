//! Mamba (the first), the selective state-space layer of mlx-lm's `mamba.py` (state-spaces
//! Mamba, Falcon Mamba): the input projected to `x` and a gate `z`; a causal depthwise
//! convolution over `x` (its last `kernel - 1` inputs cached) and SiLU; then, token by token,
//! `x_proj` gives a low-rank time step and the state's input and output mixings `B`, `C`
//! (Falcon Mamba RMS-normalises the three, without weights), the time step goes through
//! `dt_proj` and softplus, and a `(channels, state)` state per sequence decays by
//! `exp(dt A)` and takes `dt x B`; `y = state C + D x`, gated by `silu(z)`; `out_proj`.
//!
//! Same ops, same order, same dtypes as mlx-lm's `ssm_step` (run on every backend: there is no
//! kernel), so the sums round alike.

use mlx_rs::{
    fast,
    ops::{self, indexing::IndexOp},
    Array,
};

use crate::{
    error::EngineError,
    layers::kv_cache::StateCache,
    layers::weights::{invalid, Weights},
    layers::{
        activation::Activation,
        array::scalar_like,
        array::Result,
        linear::{check_dims, Linear},
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// A Mamba layer's sizes, from config.json.
#[derive(Debug, Clone)]
pub struct MambaSpec {
    pub intermediate_size: i32,
    pub state_size: i32,
    pub conv_kernel: i32,
    pub time_step_rank: i32,
    /// Falcon Mamba's: the time steps, `B` and `C` RMS-normalised (no weight) at this epsilon.
    pub bcdt_norm_eps: Option<f32>,
}

pub struct Mamba {
    in_proj: Linear,
    /// `(channels, kernel, 1)`, MLX's layout.
    conv1d: Array,
    conv_bias: Option<Array>,
    x_proj: Linear,
    dt_proj: Linear,
    a_log: Array,
    d: Array,
    out_proj: Linear,
    spec: MambaSpec,
}

impl Mamba {
    /// The layer at `prefix` (`model.layers.N.mamba`, the checkpoint's `mixer`).
    pub fn load(weights: &mut Weights, prefix: &str, spec: MambaSpec) -> LoadResult<Self> {
        let s = &spec;
        let (channels, state, kernel, rank) = (
            s.intermediate_size,
            s.state_size,
            s.conv_kernel,
            s.time_step_rank,
        );
        if [channels, state, kernel, rank].iter().any(|&n| n < 1) {
            return Err(invalid(format!(
                "config.json: intermediate_size ({channels}), state_size ({state}), conv_kernel \
                 ({kernel}) and time_step_rank ({rank}) must be at least 1"
            )));
        }
        let p = |name: &str| format!("{prefix}.{name}");
        let conv1d = weights.take(&p("conv1d.weight"))?;
        // Hugging Face stores `(channels, 1, kernel)`; mlx-lm's sanitize moves the kernel axis.
        let conv1d = match (conv1d.ndim(), conv1d.shape().last()) {
            (3, Some(1)) => conv1d,
            (3, _) => conv1d.swap_axes(1, 2)?,
            _ => {
                return Err(invalid(format!(
                    "`{}` is {:?}, not a depthwise convolution (channels, kernel, 1)",
                    p("conv1d.weight"),
                    conv1d.shape()
                )))
            }
        };
        if conv1d.shape() != [channels, kernel, 1] {
            return Err(invalid(format!(
                "`{}` is {:?} but config.json implies {:?}: config.json does not describe these \
                 weights",
                p("conv1d.weight"),
                conv1d.shape(),
                [channels, kernel, 1]
            )));
        }
        let per_state = |name: &str, a: Array, shape: &[i32]| -> LoadResult<Array> {
            match a.shape() == shape {
                true => Ok(a),
                false => Err(invalid(format!(
                    "`{}` is {:?} but config.json implies {shape:?}",
                    p(name),
                    a.shape()
                ))),
            }
        };
        let a_log = per_state("A_log", weights.take(&p("A_log"))?, &[channels, state])?;
        let d = per_state("D", weights.take(&p("D"))?, &[channels])?;
        let layer = Self {
            in_proj: weights.linear(&p("in_proj"))?,
            conv1d,
            conv_bias: weights.remove(&p("conv1d.bias")),
            x_proj: weights.linear(&p("x_proj"))?,
            dt_proj: weights.linear(&p("dt_proj"))?,
            out_proj: weights.linear(&p("out_proj"))?,
            a_log,
            d,
            spec,
        };
        layer.check_shapes(prefix)?;
        Ok(layer)
    }

    /// Refuses projections of other sizes than config.json implies.
    fn check_shapes(&self, prefix: &str) -> LoadResult<()> {
        let s = &self.spec;
        let (channels, state, rank) = (s.intermediate_size, s.state_size, s.time_step_rank);
        let hidden = self.out_proj.dims().0;
        let expected = [
            ("in_proj", &self.in_proj, (2 * channels, hidden)),
            ("x_proj", &self.x_proj, (rank + 2 * state, channels)),
            ("dt_proj", &self.dt_proj, (channels, rank)),
            ("out_proj", &self.out_proj, (hidden, channels)),
        ];
        let sizes = format!("{channels} channels, state {state}, time-step rank {rank}");
        check_dims(prefix, &expected, &sizes)
    }

    /// `(B, S, hidden)` -> `(B, S, hidden)`, carrying the convolution window and the state in
    /// `cache` from the previous call to the next.
    pub fn forward(&self, x: &Array, cache: &mut StateCache) -> Result<Array> {
        let xz = self.in_proj.forward(x)?;
        let mut halves = xz.split_equal(2, -1)?.into_iter();
        let (x, z) = (halves.next().unwrap(), halves.next().unwrap());
        let conv = cache.convolve(&x, &self.conv1d, self.conv_bias.as_ref())?;
        let x = conv.multiply(ops::sigmoid(&conv)?)?;
        let a = ops::exp(&self.a_log)?.negative()?;
        let mut state = cache.state.take();
        let mut ys = Vec::with_capacity(x.dim(1) as usize);
        for t in 0..x.dim(1) {
            let (y, next) = self.step(&x.index((.., t)), &a, state.as_ref())?;
            if let Some(steps) = cache.step_states() {
                steps.push(next.clone());
            }
            ys.push(y);
            state = Some(next);
        }
        cache.state = state;
        cache.advance(x.dim(1));
        let y = ops::stack(&ys, 1)?;
        // mlx-lm's `swiglu(z, y)`: fused on a GPU as its compiled one, ops on the CPU.
        self.out_proj.forward(&Activation::Silu.gated(&z, &y)?)
    }

    /// One token `x` `(B, channels)` (mlx-lm's `ssm_step`): its output and the next state.
    fn step(&self, x: &Array, a: &Array, state: Option<&Array>) -> Result<(Array, Array)> {
        let (rank, n) = (self.spec.time_step_rank, self.spec.state_size);
        let parts = (self.x_proj.forward(x)?).split_at_indices(&[rank, rank + n], -1)?;
        let [delta, b, c]: [Array; 3] = parts.try_into().expect("split at two indices");
        let (delta, b, c) = match self.spec.bcdt_norm_eps {
            Some(eps) => (
                fast::rms_norm(&delta, None, eps)?,
                fast::rms_norm(&b, None, eps)?,
                fast::rms_norm(&c, None, eps)?,
            ),
            None => (delta, b, c),
        };
        let delta = self.dt_proj.forward(&delta)?;
        let delta = ops::logaddexp(&delta, scalar_like(0.0, &delta)?)?;
        let taken = delta
            .multiply(x)?
            .expand_dims(-1)?
            .multiply(b.expand_dims(1)?)?;
        let state = match state {
            Some(state) => {
                let decay = ops::exp(delta.expand_dims(-1)?.multiply(a)?)?;
                taken.add(state.multiply(decay)?)?
            }
            None => taken,
        };
        let y = state.matmul(c.expand_dims(-1)?)?.squeeze_axes(&[2])?;
        Ok((y.add(self.d.multiply(x)?)?, state))
    }

    /// The linear layers under their checkpoint names (relative to the layer's `mixer.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("in_proj", &mut self.in_proj),
            ("x_proj", &mut self.x_proj),
            ("dt_proj", &mut self.dt_proj),
            ("out_proj", &mut self.out_proj),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn a_state_of_another_size_is_refused_by_name() {
        let _mlx = fixtures::mlx_test_lock();
        let spec = MambaSpec {
            intermediate_size: 8,
            state_size: 4,
            conv_kernel: 4,
            time_step_rank: 1,
            bcdt_norm_eps: None,
        };
        let zeros = |shape: &[i32]| ops::zeros::<f32>(shape).unwrap();
        let p = "model.layers.0.mamba";
        let mut tensors = HashMap::new();
        tensors.insert(format!("{p}.conv1d.weight"), zeros(&[8, 1, 4]));
        // A state of 3 where config.json says 4.
        tensors.insert(format!("{p}.A_log"), zeros(&[8, 3]));
        let mut weights = Weights::from_tensors(tensors, &json!({}));
        let err = match Mamba::load(&mut weights, p, spec) {
            Ok(_) => panic!("loaded a damaged state"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("A_log") && err.contains("[8, 4]"), "{err}");
    }
}
