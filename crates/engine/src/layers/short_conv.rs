//! A gated short convolution (LFM2's `conv` layers, mlx-lm's `ShortConv`): the input projected
//! to three parts `B`, `C`, `x`; `B * x` through a causal depthwise convolution of `kernel`
//! taps, whose last `kernel - 1` inputs are cached (a [`StateCache`]'s `conv`, as mlx-lm's
//! `ArraysCache(size=1)`); the result gated by `C` and projected out. No attention, no
//! positions: like the gated delta-net's, its cache summarises every position seen.

use mlx_rs::Array;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::StateCache,
    layers::weights::Weights,
    layers::{array::Result, linear::Linear},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// The convolution's size, from config.json (`conv_L_cache`).
#[derive(Debug, Clone, Copy)]
pub struct ShortConvSpec {
    pub kernel: i32,
}

pub struct ShortConv {
    /// `hidden -> 3 * hidden`: `B`, `C`, `x` side by side.
    in_proj: Linear,
    /// `(hidden, kernel, 1)`, MLX's layout (one group per channel).
    weight: Array,
    /// `(hidden,)`, with `conv_bias`.
    bias: Option<Array>,
    out_proj: Linear,
}

impl ShortConv {
    /// The layer at `prefix` (`model.layers.N.conv`): `in_proj`, `conv` and `out_proj`.
    pub fn load(weights: &mut Weights, prefix: &str, spec: ShortConvSpec) -> LoadResult<Self> {
        let p = |name: &str| format!("{prefix}.{name}");
        let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
        if spec.kernel < 2 {
            return Err(invalid(format!(
                "config.json: conv_L_cache is {}; a short convolution needs at least 2 taps",
                spec.kernel
            )));
        }
        let in_proj = weights.linear(&p("in_proj"))?;
        let out_proj = weights.linear(&p("out_proj"))?;
        let weight = weights.take(&p("conv.weight"))?;
        // Hugging Face stores `(channels, 1, kernel)`; mlx-lm's sanitize moves the kernel axis.
        let weight = match weight.ndim() == 3 && weight.dim(-1) > weight.dim(1) {
            true => weight.swap_axes(1, 2)?,
            false => weight,
        };
        let hidden = out_proj.weight.dim(0);
        let expected = [hidden, spec.kernel, 1];
        if weight.shape() != expected {
            return Err(invalid(format!(
                "`{}` is {:?} but config.json implies {expected:?}: config.json does not \
                 describe these weights",
                p("conv.weight"),
                weight.shape()
            )));
        }
        let bias = weights.remove(&p("conv.bias"));
        Ok(Self {
            in_proj,
            weight,
            bias,
            out_proj,
        })
    }

    /// `(B, S, hidden)` -> `(B, S, hidden)`, carrying the convolution's last inputs in `cache`
    /// from one call (prefill chunk or decode step) to the next.
    pub fn forward(&self, x: &Array, cache: &mut StateCache) -> Result<Array> {
        let bcx = self.in_proj.forward(x)?;
        let mut parts = bcx.split_equal(3, -1)?.into_iter();
        let mut next = || parts.next().expect("split gives three parts");
        let (b, c, x_part) = (next(), next(), next());
        let bx = b.multiply(&x_part)?;
        let conv = cache.convolve(&bx, &self.weight, self.bias.as_ref())?;
        cache.advance(x.dim(1));
        self.out_proj.forward(&c.multiply(&conv)?)
    }

    /// The linear layers under their checkpoint names (relative to the layer).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        vec![
            ("in_proj", &mut self.in_proj),
            ("out_proj", &mut self.out_proj),
        ]
    }
}
