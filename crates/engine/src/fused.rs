//! Gated activations as one kernel on a GPU, as mlx-lm runs them (`mx.compile`d `swiglu`,
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

use mlx_rs::{error::Exception, transforms::compile::compile, Array};

use crate::{
    device::on_gpu,
    nn::{Activation, Result},
};

type Compiled = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> Result<Array>>;
type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> Result<Array>>;

thread_local! {
    static COMPILED: RefCell<Vec<(Activation, Compiled)>> = const { RefCell::new(Vec::new()) };
    static GELU: RefCell<Option<Compiled1>> = const { RefCell::new(None) };
}

/// The exact (erf) GELU through MLX's compile on every device, as mlx-vlm's `nn.gelu` (compiled
/// in MLX's own `nn`) runs it. On the CPU the compiled kernel is not always the unfused ops bit
/// for bit: on an AVX-512 machine (AMD family 26) MLX's float32 `erf` op and the compiled
/// kernel's differ in the last bit for 42% of inputs (docs/traps.md), enough to turn a
/// near-tie of a LLaVA model's next token.
pub(crate) fn gelu(x: &Array) -> Result<Array> {
    GELU.with(|cell| {
        let mut cell = cell.borrow_mut();
        let f = cell.get_or_insert_with(|| {
            let f = |x: &Array| -> std::result::Result<Array, Exception> { crate::nn::gelu_ops(x) };
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
        let want = crate::nn::gelu_ops(&x).unwrap();
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
