//! The Pixtral vision tower (Mistral 3's), as mlx-vlm 0.7.0's `pixtral/vision.py` computes it:
//! a patch convolution (no bias) over the batch of padded images, each image's own patches
//! (its size in patches) taken out and all images' patches put in one sequence, an RMS norm
//! (`ln_pre`), then pre-norm layers (RMS norms, attention without biases, SwiGLU MLP) whose
//! attention turns queries and keys by 2-D rotary angles (a patch's row times the even
//! frequencies, its column times the odd ones, the half repeated; applied as
//! `x * cos + rotate_half(x) * sin`) and sees only the patches of its own image (a block mask
//! of 0 and -1e9 in the tower's dtype). Every layer's output is kept: the model takes one of
//! them (`vision_feature_layer`).

use mlx_rs::{ops, ops::indexing::IndexOp, Array};
use serde::Deserialize;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::{rotate_half, Activation, Linear, Result, RmsNorm},
    vision::siglip::conv_weight,
};

/// mlx-vlm's pixtral `VisionConfig` and its defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct PixtralConfig {
    #[serde(default = "default_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_head_dim")]
    pub head_dim: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_patch_size")]
    pub patch_size: i32,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
}

fn default_layers() -> usize {
    24
}
fn default_hidden() -> i32 {
    1024
}
fn default_head_dim() -> i32 {
    64
}
fn default_heads() -> i32 {
    16
}
fn default_patch_size() -> i32 {
    14
}
fn default_eps() -> f32 {
    1e-5
}
fn default_theta() -> f32 {
    10000.0
}

struct Layer {
    attention_norm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    ffn_norm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

pub struct PixtralTower {
    /// `(hidden, patch, patch, channels)`.
    patch_conv: Array,
    ln_pre: RmsNorm,
    layers: Vec<Layer>,
    heads: i32,
    /// mlx-vlm's attention: `hidden / heads` per head, scaled by its `-0.5` power.
    scale: f32,
    /// The rotary frequencies `1 / theta^(2i / head_dim)`, `(head_dim / 2,)` float32.
    freqs: Array,
    patch_size: i32,
}

impl PixtralTower {
    /// The tower from tensors named as under mlx-vlm's `vision_tower.vision_model.`.
    pub fn load(config: &PixtralConfig, w: &mut Weights) -> std::result::Result<Self, EngineError> {
        let eps = config.rms_norm_eps;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("transformer.layers.{i}");
            let mut linear = |name: &str| w.linear(&format!("{p}.{name}"));
            let (q_proj, k_proj, v_proj, o_proj) = (
                linear("attention.q_proj")?,
                linear("attention.k_proj")?,
                linear("attention.v_proj")?,
                linear("attention.o_proj")?,
            );
            let (gate_proj, up_proj, down_proj) = (
                linear("feed_forward.gate_proj")?,
                linear("feed_forward.up_proj")?,
                linear("feed_forward.down_proj")?,
            );
            layers.push(Layer {
                attention_norm: w.rms_norm(&format!("{p}.attention_norm"), eps)?,
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                ffn_norm: w.rms_norm(&format!("{p}.ffn_norm"), eps)?,
                gate_proj,
                up_proj,
                down_proj,
            });
        }
        let dim = config.head_dim;
        // `1.0 / base ** (arange(0, dim, 2).astype(float32) / dim)`, in MLX's f32 ops.
        let exponents = ops::arange::<_, f32>(0, dim, 2)?.divide(Array::from_f32(dim as f32))?;
        let freqs = Array::from_f32(1.0)
            .divide(ops::power(Array::from_f32(config.rope_theta), &exponents)?)?;
        let per_head = config.hidden_size / config.num_attention_heads;
        let load = |e: mlx_rs::error::Exception| {
            EngineError::load(crate::error::LoadErrorKind::InvalidWeights, e.to_string())
        };
        Ok(Self {
            patch_conv: conv_weight(w.take("patch_conv.weight")?).map_err(load)?,
            ln_pre: w.rms_norm("ln_pre", 1e-5)?,
            layers,
            heads: config.num_attention_heads,
            scale: (per_head as f64).powf(-0.5) as f32,
            freqs,
            patch_size: config.patch_size,
        })
    }

    /// Every hidden state (`ln_pre`'s output, then each layer's), `(1, patches, hidden)`, for
    /// padded images `(B, H, W, C)` whose sizes before padding are `sizes` (`[height, width]`).
    pub fn hidden_states(&self, pixels: &Array, sizes: &[[usize; 2]]) -> Result<Vec<Array>> {
        let p = self.patch_size;
        let embeds = ops::conv2d(
            pixels.as_dtype(self.patch_conv.dtype())?,
            &self.patch_conv,
            (p, p),
            None,
            None,
            None,
        )?;
        let d = embeds.dim(-1);
        let mut patches = Vec::with_capacity(sizes.len());
        let (mut rows, mut cols, mut lengths) = (Vec::new(), Vec::new(), Vec::new());
        for (i, [h, w]) in sizes.iter().enumerate() {
            let (gh, gw) = ((*h as i32) / p, (*w as i32) / p);
            let image = embeds.index((i as i32, ..gh, ..gw, ..));
            patches.push(image.reshape(&[-1, d])?);
            for r in 0..gh {
                for c in 0..gw {
                    rows.push(r as f32);
                    cols.push(c as f32);
                }
            }
            lengths.push((gh * gw) as usize);
        }
        let x = ops::concatenate(&patches, 0)?.expand_dims(0)?;
        let x = self.ln_pre.forward(&x)?;
        let (cos, sin) = self.rotary(&rows, &cols, x.dtype())?;
        let mask = block_mask(&lengths, x.dtype())?;
        let mut states = vec![x.clone()];
        let mut x = x;
        for layer in &self.layers {
            x = self.layer(layer, &x, &cos, &sin, &mask)?;
            states.push(x.clone());
        }
        Ok(states)
    }

    /// `cos` and `sin` `(patches, head_dim)` in `dtype`: the angles of each patch's row times
    /// the even frequencies and its column times the odd ones, repeated (mlx-vlm's table row
    /// `row * max_width + column`, whose entries are exactly these products).
    fn rotary(&self, rows: &[f32], cols: &[f32], dtype: mlx_rs::Dtype) -> Result<(Array, Array)> {
        let n = rows.len() as i32;
        let half = self.freqs.dim(0);
        let every_other = |first: i32| {
            let at: Vec<i32> = (first..half).step_by(2).collect();
            self.freqs
                .take_axis(Array::from_slice(&at, &[at.len() as i32]), 0)
        };
        let (even, odd) = (every_other(0)?, every_other(1)?);
        let rows = Array::from_slice(rows, &[n, 1]);
        let cols = Array::from_slice(cols, &[n, 1]);
        let angles = ops::concatenate(&[rows.multiply(&even)?, cols.multiply(&odd)?], -1)?;
        let angles = ops::concatenate(&[angles.clone(), angles], -1)?;
        Ok((
            ops::cos(&angles)?.as_dtype(dtype)?,
            ops::sin(&angles)?.as_dtype(dtype)?,
        ))
    }

    fn layer(&self, l: &Layer, x: &Array, cos: &Array, sin: &Array, mask: &Array) -> Result<Array> {
        let y = l.attention_norm.forward(x)?;
        let (b, n) = (y.dim(0), y.dim(1));
        let split = |t: Array| -> Result<Array> {
            t.reshape(&[b, n, self.heads, -1])?
                .transpose_axes(&[0, 2, 1, 3])
        };
        let q = split(l.q_proj.forward(&y)?)?;
        let k = split(l.k_proj.forward(&y)?)?;
        let v = split(l.v_proj.forward(&y)?)?;
        let turn =
            |t: &Array| -> Result<Array> { t.multiply(cos)?.add(rotate_half(t)?.multiply(sin)?) };
        let (q, k) = (turn(&q)?, turn(&k)?);
        let o = crate::layers::sdpa::sdpa(&q, &k, &v, self.scale, Some(mask.into()), None)?;
        let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, n, -1])?;
        let x = x.add(l.o_proj.forward(&o)?)?;
        let y = l.ffn_norm.forward(&x)?;
        let ff = Activation::Silu.gated(&l.gate_proj.forward(&y)?, &l.up_proj.forward(&y)?)?;
        x.add(l.down_proj.forward(&ff)?)
    }
}

/// mlx-vlm's `generate_block_attention_mask`: -1e9 everywhere but each image's own block of
/// patches, `(1, 1, patches, patches)` in `dtype`.
fn block_mask(lengths: &[usize], dtype: mlx_rs::Dtype) -> Result<Array> {
    let n: usize = lengths.iter().sum();
    let mut mask = vec![-1e9f32; n * n];
    let mut start = 0;
    for &len in lengths {
        for i in start..start + len {
            mask[i * n + start..i * n + start + len].fill(0.0);
        }
        start += len;
    }
    Array::from_slice(&mask, &[1, 1, n as i32, n as i32]).as_dtype(dtype)
}
