//! Quantized weights and the MLX operations over them, in every quantization mode the engine
//! runs: `affine` (a scale and a bias per group, mlx-lm's default) and `mxfp4` (4-bit floats,
//! one shared power-of-two scale per group of 32, no biases: OpenAI's GPT-OSS experts).
//!
//! mlx-rs 0.33 calls MLX's quantized operations in affine mode only (its `quantized_matmul`,
//! `gather_qmm` and `dequantize` pass `"affine"` to mlx-c). Other modes reach mlx-c through
//! mlx-sys here, the one place that does (docs/decisions/moe.md).

use std::ffi::CStr;

use mlx_rs::{error::Exception, ops, Array, Stream};

use crate::layers::array::Result;

/// How a weight is quantized (config.json's `quantization.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    Affine,
    Mxfp4,
}

impl QuantMode {
    /// The mode config.json names, if the engine runs it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "affine" => Some(Self::Affine),
            "mxfp4" => Some(Self::Mxfp4),
            _ => None,
        }
    }

    fn name(self) -> &'static CStr {
        match self {
            Self::Affine => c"affine",
            Self::Mxfp4 => c"mxfp4",
        }
    }
}

/// A quantized weight's parameters: per-group scales, and biases in affine mode.
#[derive(Debug)]
pub struct Quantized {
    pub scales: Array,
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
}

impl Quantized {
    /// `x @ w.T` (`transpose`) or `x @ w` for the packed `w` these parameters describe.
    pub fn matmul(&self, x: &Array, w: &Array, transpose: bool) -> Result<Array> {
        if self.mode == QuantMode::Affine {
            let (g, b) = (self.group_size, self.bits);
            return ops::quantized_matmul(
                x,
                w,
                &self.scales,
                self.biases.as_ref(),
                transpose,
                g,
                b,
            );
        }
        self.call("quantized_matmul", |res, s| unsafe {
            mlx_sys::mlx_quantized_matmul(
                res,
                x.as_ptr(),
                w.as_ptr(),
                self.scales.as_ptr(),
                self.biases_ptr(),
                transpose,
                self.group_size_opt(),
                self.bits_opt(),
                self.mode.name().as_ptr(),
                s,
            )
        })
    }

    /// mlx's `gather_qmm`: `x @ w[e].T` for the expert `e` each entry of `indices` names.
    pub fn gather_matmul(
        &self,
        x: &Array,
        w: &Array,
        indices: &Array,
        sorted: bool,
    ) -> Result<Array> {
        if self.mode == QuantMode::Affine {
            let biases = self.biases.as_ref();
            let (g, b) = (self.group_size, self.bits);
            return ops::gather_qmm(
                x,
                w,
                &self.scales,
                biases,
                None,
                indices,
                true,
                g,
                b,
                sorted,
            );
        }
        self.call("gather_qmm", |res, s| unsafe {
            mlx_sys::mlx_gather_qmm(
                res,
                x.as_ptr(),
                w.as_ptr(),
                self.scales.as_ptr(),
                self.biases_ptr(),
                mlx_sys::mlx_array_new(),
                indices.as_ptr(),
                true,
                self.group_size_opt(),
                self.bits_opt(),
                self.mode.name().as_ptr(),
                sorted,
                s,
            )
        })
    }

    /// The rows `ids` of the packed table `w`, dequantized (a quantized embedding lookup).
    pub fn dequantize_rows(&self, w: &Array, ids: &Array) -> Result<Array> {
        let biases = self.biases.as_ref().map(|b| b.take_axis(ids, 0));
        self.dequantize_parts(
            &w.take_axis(ids, 0)?,
            &self.scales.take_axis(ids, 0)?,
            biases.transpose()?.as_ref(),
        )
    }

    /// The whole packed `w`, dequantized (mlx's `dequantize`).
    pub fn dequantize(&self, w: &Array) -> Result<Array> {
        self.dequantize_parts(w, &self.scales, self.biases.as_ref())
    }

    fn dequantize_parts(&self, w: &Array, scales: &Array, biases: Option<&Array>) -> Result<Array> {
        if self.mode == QuantMode::Affine {
            return ops::dequantize(w, scales, biases, self.group_size, self.bits);
        }
        let no_dtype = mlx_sys::mlx_optional_dtype {
            value: mlx_sys::mlx_dtype__MLX_FLOAT32,
            has_value: false,
        };
        self.call("dequantize", |res, s| unsafe {
            mlx_sys::mlx_dequantize(
                res,
                w.as_ptr(),
                scales.as_ptr(),
                biases.map_or(mlx_sys::mlx_array_new(), |b| b.as_ptr()),
                self.group_size_opt(),
                self.bits_opt(),
                self.mode.name().as_ptr(),
                mlx_sys::mlx_array_new(),
                no_dtype,
                s,
            )
        })
    }

    /// The arrays these parameters hold.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        std::iter::once(&self.scales).chain(&self.biases)
    }

    fn biases_ptr(&self) -> mlx_sys::mlx_array {
        match &self.biases {
            Some(b) => b.as_ptr(),
            None => unsafe { mlx_sys::mlx_array_new() },
        }
    }

    fn group_size_opt(&self) -> mlx_sys::mlx_optional_int {
        optional_int(self.group_size)
    }

    fn bits_opt(&self) -> mlx_sys::mlx_optional_int {
        optional_int(self.bits)
    }

    /// Runs one mlx-c operation on the current stream into a new array.
    fn call(
        &self,
        op: &str,
        f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array> {
        let stream = Stream::thread_local_or_default();
        let mut res = unsafe { mlx_sys::mlx_array_new() };
        let status = f(&mut res, stream.as_ptr());
        // Owned from here on, so freed on every path.
        let out = unsafe { Array::from_ptr(res) };
        match status {
            0 => Ok(out),
            _ => Err(Exception::custom(format!(
                "MLX {op} in {:?} mode ({} bits, groups of {}) failed: the weights do not have \
                 the shapes this mode needs",
                self.mode, self.bits, self.group_size
            ))),
        }
    }
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}
