//! Activations: the gated MLP's (`act(gate) * up`) and the GELU variants.
//!
//! Gated activations run as one kernel on a GPU, as mlx-lm runs them (`mx.compile`d `swiglu`,
//! `swiglu_oai`, Gemma's `geglu`): there a decode step is bound by kernel launches, and
//! `silu(gate) * up` as three kernels instead of one costs mlx-lm's own decode 7% on an H200
//! (`xtask/cuda/launch_probe.py`, docs/decisions/cuda.md). On the CPU the ops run unfused:
//! MLX's CPU compile builds each kernel with the system C++ compiler into a directory that
//! concurrent processes race on, a decode step there is bound by reading weights, and the CPU
//! path is what the parity tests prove bit for bit. The exact GELU is compiled everywhere
//! ([`gelu`]): mlx-vlm's is MLX's compiled `nn.gelu`, and on some CPUs the compiled kernel and
//! the unfused ops differ in the last bit.
//!
//! A compiled function is traced once per activation (constants included) and thread: MLX's
//! compiled closures are not `Send`, and one thread runs MLX.

use std::cell::RefCell;

use mlx_rs::{error::Exception, ops, transforms::compile::compile, Array};

use crate::layers::{
    array::{scalar_like, Result},
    device::on_gpu,
};

/// The activation of a gated MLP: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (SwiGLU: Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// `gelu_approx(gate) * up` (GeGLU with the tanh approximation: Gemma).
    GeluApprox,
    /// GPT-OSS's clamped SwiGLU (mlx-lm's `swiglu_oai`): the gate clipped from above at
    /// `limit`, the up projection clipped to `[-limit, limit]` and shifted by one:
    /// `(clip(up) + 1) * (g * sigmoid(alpha * g))` with `g = min(gate, limit)`.
    ClampedSilu { alpha: f32, limit: f32 },
    /// `relu(x)²`: ungated, `down(relu(up(x))²)` (Nemotron-H's MLPs and experts).
    Relu2,
    /// Gemma 3n's sparse GeGLU (mlx-lm's `gelu_topk`): the gate's features below `mean + std *
    /// std_multiplier` (over each position's features) cut to zero before `gelu_approx`, which
    /// keeps about the top `1 - s` of them for `std_multiplier = sqrt(2) erfinv(2 s - 1)`.
    GeluTopK { std_multiplier: f32 },
}

impl Activation {
    /// `act(gate) * up`: one fused kernel on a GPU, as mlx-lm's compiled activations, the
    /// unfused ops ([`Self::gated_ops`]) on the CPU.
    pub fn gated(self, gate: &Array, up: &Array) -> Result<Array> {
        gated(self, gate, up)
    }

    /// `act(gate) * up` as MLX ops, unfused.
    pub fn gated_ops(self, gate: &Array, up: &Array) -> Result<Array> {
        match self {
            Self::Silu => gate.multiply(ops::sigmoid(gate)?)?.multiply(up),
            Self::GeluApprox => gelu_approx(gate)?.multiply(up),
            Self::ClampedSilu { alpha, limit } => {
                let c = |v: f32| scalar_like(v, gate);
                let gate = ops::minimum(gate, c(limit)?)?;
                let up = ops::clip(up, (c(-limit)?, c(limit)?))?;
                let glu = gate.multiply(ops::sigmoid(c(alpha)?.multiply(&gate)?)?)?;
                up.add(c(1.0)?)?.multiply(glu)
            }
            Self::Relu2 => relu2(gate)?.multiply(up),
            Self::GeluTopK { std_multiplier } => gelu_topk(gate, std_multiplier)?.multiply(up),
        }
    }

    /// `act(x)` of an ungated MLP (`down(act(up(x)))`); only [`Activation::Relu2`] is one.
    pub fn ungated(self, x: &Array) -> Result<Array> {
        match self {
            Self::Relu2 => relu2(x),
            other => Err(Exception::custom(format!(
                "{other:?} is a gated activation"
            ))),
        }
    }
}

/// `gelu_approx(max(0, x - (mean + std * m)))`, mean and (population) standard deviation over
/// the last axis, `m` in their dtype.
fn gelu_topk(x: &Array, std_multiplier: f32) -> Result<Array> {
    let mean = x.mean_axis(-1, true)?;
    let std = ops::std_axes(x, &[-1], true, 0)?;
    let cutoff = mean.add(std.multiply(scalar_like(std_multiplier, &std)?)?)?;
    gelu_approx(&ops::maximum(scalar_like(0.0, x)?, x.subtract(&cutoff)?)?)
}

/// The `std_multiplier` of [`Activation::GeluTopK`] for sparsity `s`: `sqrt(2) erfinv(2 s -
/// 1)`, as mlx-lm computes it (MLX's float32 `erfinv`, times `sqrt(2)` as float32).
pub fn topk_std_multiplier(sparsity: f64) -> Result<f32> {
    let e = ops::erfinv(Array::from_f32((2.0 * sparsity - 1.0) as f32))?;
    let m = e.multiply(Array::from_f32(std::f64::consts::SQRT_2 as f32))?;
    m.eval()?;
    Ok(m.item_exact::<f32>())
}

/// `max(x, 0)²` (MLX's `nn.relu2`).
pub fn relu2(x: &Array) -> Result<Array> {
    ops::square(ops::maximum(x, scalar_like(0.0, x)?)?)
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, in mlx's operation order, constants in
/// `x`'s dtype.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let c = |v: f64| scalar_like(v as f32, x);
    let cubic = x.add(c(0.044715)?.multiply(x.power(c(3.0)?)?)?)?;
    let inner = ops::tanh(c((2.0 / std::f64::consts::PI).sqrt())?.multiply(&cubic)?)?;
    c(0.5)?.multiply(x)?.multiply(c(1.0)?.add(&inner)?)
}

/// MLX's `gelu_fast_approx` (`nn.GELU(approx="fast")`, quick GELU): `x * sigmoid(1.702 x)`,
/// the constant in `x`'s dtype.
pub fn quick_gelu(x: &Array) -> Result<Array> {
    x.multiply(ops::sigmoid(scalar_like(1.702, x)?.multiply(x)?)?)
}

/// [`gelu`] as MLX ops, unfused.
pub fn gelu_ops(x: &Array) -> Result<Array> {
    let c = |v: f64| scalar_like(v as f32, x);
    let erf = ops::erf(x.divide(c(std::f64::consts::SQRT_2)?)?)?;
    x.multiply(c(1.0)?.add(&erf)?)?.divide(c(2.0)?)
}

type Compiled = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> Result<Array>>;
type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> Result<Array>>;

thread_local! {
    static COMPILED: RefCell<Vec<(Activation, Compiled)>> = const { RefCell::new(Vec::new()) };
    static GELU: RefCell<Option<Compiled1>> = const { RefCell::new(None) };
}

/// MLX's exact `gelu` (`nn.GELU()`): `x * (1 + erf(x / sqrt(2))) / 2`, constants in `x`'s dtype,
/// through MLX's compile on every device, as mlx-vlm's `nn.gelu` (compiled
/// in MLX's own `nn`) runs it. On the CPU the compiled kernel is not always the unfused ops bit
/// for bit: on an AVX-512 machine (AMD family 26) MLX's float32 `erf` op and the compiled
/// kernel's differ in the last bit for 42% of inputs (docs/traps.md), enough to turn a
/// near-tie of a LLaVA model's next token.
pub fn gelu(x: &Array) -> Result<Array> {
    GELU.with(|cell| {
        let mut cell = cell.borrow_mut();
        let f = cell.get_or_insert_with(|| {
            let f = |x: &Array| -> std::result::Result<Array, Exception> { gelu_ops(x) };
            let mut traced = compile(f, true);
            Box::new(move |x| traced(x))
        });
        f(x)
    })
}

/// `act(gate) * up`, fused into one kernel on a GPU.
pub(crate) fn gated(act: Activation, gate: &Array, up: &Array) -> Result<Array> {
    match on_gpu() {
        true => gated_compiled(act, gate, up),
        false => act.gated_ops(gate, up),
    }
}

/// `act(gate) * up` through MLX's compile (shapeless, as mlx-lm's), whatever the device.
pub(crate) fn gated_compiled(act: Activation, gate: &Array, up: &Array) -> Result<Array> {
    COMPILED.with(|compiled| {
        let mut compiled = compiled.borrow_mut();
        let at = match compiled.iter().position(|(a, _)| *a == act) {
            Some(at) => at,
            None => {
                let f = move |(g, u): (&Array, &Array)| -> std::result::Result<Array, Exception> {
                    act.gated_ops(g, u)
                };
                let mut traced = compile(f, true);
                let call: Compiled = Box::new(move |args| traced(args));
                compiled.push((act, call));
                compiled.len() - 1
            }
        };
        (compiled[at].1)((gate, up))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compiled_activation_computes_what_its_ops_compute() {
        let _mlx = fixtures::mlx_test_lock();
        let gate = mlx_rs::random::normal::<f32>(&[3, 40], None, None, None).unwrap();
        let up = mlx_rs::random::normal::<f32>(&[3, 40], None, None, None).unwrap();
        let acts = [
            Activation::Silu,
            Activation::GeluApprox,
            Activation::ClampedSilu {
                alpha: 1.702,
                limit: 7.0,
            },
        ];
        for act in acts {
            let want = act.gated_ops(&gate, &up).unwrap();
            // Twice: the second call reuses the traced function; another shape needs no trace.
            for (g, u) in [(&gate, &up), (&gate, &up)] {
                let got = gated_compiled(act, g, u).unwrap();
                assert!(got.all_close(&want, 1e-5, 1e-6, None).unwrap(), "{act:?}");
            }
            let row = |a: &Array| a.reshape(&[120]).unwrap();
            let got = gated_compiled(act, &row(&gate), &row(&up)).unwrap();
            let close = got.all_close(row(&want), 1e-5, 1e-6, None).unwrap();
            assert!(close, "{act:?}");
        }
        COMPILED.with(|c| assert_eq!(c.borrow().len(), 3, "one trace per activation"));
    }

    #[test]
    fn the_compiled_gelu_computes_what_its_ops_compute() {
        let _mlx = fixtures::mlx_test_lock();
        let x = mlx_rs::random::normal::<f32>(&[5, 64], None, None, None).unwrap();
        let want = gelu_ops(&x).unwrap();
        for x in [&x, &x.reshape(&[320]).unwrap()] {
            let got = gelu(x).unwrap();
            let close = got
                .reshape(&[5, 64])
                .unwrap()
                .all_close(&want, 1e-6, 1e-6, None);
            assert!(close.unwrap());
        }
    }
}
