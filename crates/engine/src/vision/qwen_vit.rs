//! What the Qwen-VL vision transformers share (mlx-vlm 0.7.0's `qwen2_5_vl` and `qwen3_vl`
//! `VisionModel`s compute these the same way): the Conv3d patch embedding over (temporal, p, p)
//! patches, attention with a fused `qkv` and 2-D rotary embedding (each patch's row and column
//! angles) within spans of patches, and those angles.

use mlx_rs::{ops, Array};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, rotate_half, Linear},
};

/// The patch embedding: a Conv3d whose kernel and stride are the patch, over the processor's
/// flattened patches `(patches, c * t * p * p)`.
pub struct PatchEmbed {
    /// `(hidden, t, p, p, channels)`: MLX's convolution layout.
    weight: Array,
    /// Qwen3-VL's convolution has one; Qwen2.5-VL's none.
    bias: Option<Array>,
    in_channels: i32,
    temporal: i32,
    patch: i32,
}

/// A Conv3d weight in MLX's `(out, t, p, p, in)` layout; PyTorch's `(out, in, t, p, p)` is
/// transposed (mlx-vlm's `check_array_shape` decides which it is).
fn conv3d_weight(w: Array) -> layers::Result<Array> {
    let s = w.shape();
    let mlx_layout = s.len() == 5 && (s[4] == 3 || (s[1] >= s[2] && s[1] >= s[3] && s[2] == s[3]));
    match mlx_layout {
        true => Ok(w),
        false => w.transpose_axes(&[0, 2, 3, 4, 1]),
    }
}

impl PatchEmbed {
    pub fn load(
        w: &mut Weights,
        in_channels: i32,
        temporal: i32,
        patch: i32,
    ) -> Result<Self, EngineError> {
        let weight = conv3d_weight(w.take("patch_embed.proj.weight")?)
            .map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, e.to_string()))?;
        Ok(Self {
            weight,
            bias: w.remove("patch_embed.proj.bias"),
            in_channels,
            temporal,
            patch,
        })
    }

    pub fn hidden(&self) -> i32 {
        self.weight.dim(0)
    }

    /// `(patches, hidden)`: the pixels cast to the convolution's dtype first, as mlx-vlm does.
    pub fn forward(&self, pixels: &Array) -> layers::Result<Array> {
        let (t, p) = (self.temporal, self.patch);
        let x = pixels
            .as_dtype(self.weight.dtype())?
            .reshape(&[-1, self.in_channels, t, p, p])?
            .move_axis(1, 4)?;
        let mut x = ops::conv3d(&x, &self.weight, (t, p, p), None, None, None)?;
        if let Some(b) = &self.bias {
            x = x.add(b)?;
        }
        x.reshape(&[-1, self.hidden()])
    }
}

/// A vision block's attention: fused `qkv` (with bias), rotary embedding, `proj`.
pub struct VitAttention {
    qkv: Linear,
    proj: Linear,
    heads: i32,
    scale: f32,
}

impl VitAttention {
    pub fn load(w: &mut Weights, p: &str, hidden: i32, heads: i32) -> Result<Self, EngineError> {
        Ok(Self {
            qkv: w.linear(&format!("{p}.qkv"))?,
            proj: w.linear(&format!("{p}.proj"))?,
            heads,
            scale: ((hidden / heads) as f64).powf(-0.5) as f32,
        })
    }

    /// Attention of `x` `(S, D)` within each span of `bounds` (cumulative ends), the queries
    /// and keys rotated by `rope` (cos, sin of [`rotary_angles`], float32).
    pub fn forward(
        &self,
        x: &Array,
        rope: &(Array, Array),
        bounds: &[i32],
    ) -> layers::Result<Array> {
        let s = x.dim(0);
        let qkv = self
            .qkv
            .forward(x)?
            .reshape(&[s, 3, self.heads, -1])?
            .transpose_axes(&[1, 0, 2, 3])?;
        let parts = qkv.split_equal(3, 0)?;
        // mlx-vlm's `apply_rotary_pos_emb_vision`: in float32 (cos/sin are), cast back.
        let rotate = |t: &Array| -> layers::Result<Array> {
            t.multiply(&rope.0)?
                .add(rotate_half(t)?.multiply(&rope.1)?)?
                .as_dtype(t.dtype())?
                .transpose_axes(&[0, 2, 1, 3])
        };
        let q = rotate(&parts[0])?;
        let k = rotate(&parts[1])?;
        let v = parts[2].transpose_axes(&[0, 2, 1, 3])?;
        let cuts = &bounds[..bounds.len() - 1];
        let (qs, ks, vs) = (
            q.split_at_indices(cuts, 2)?,
            k.split_at_indices(cuts, 2)?,
            v.split_at_indices(cuts, 2)?,
        );
        let mut outs = Vec::with_capacity(qs.len());
        for ((q, k), v) in qs.iter().zip(&ks).zip(&vs) {
            outs.push(crate::layers::sdpa::sdpa(q, k, v, self.scale, None, None)?);
        }
        let o = ops::concatenate(&outs, 2)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[s, -1])?;
        self.proj.forward(&o)
    }
}

/// The 2-D rotary frequencies of heads of `head_dim`: `1 / 10000^(2i / (head_dim / 2))`,
/// float32.
pub fn inv_freq(head_dim: i32) -> Result<Array, EngineError> {
    let dim = head_dim / 2;
    let freqs = || -> layers::Result<Array> {
        let exponents =
            Array::arange::<f32, f32>(0.0, dim as f32, 2.0)?.divide(Array::from_f32(dim as f32))?;
        Array::from_f32(1.0).divide(ops::power(Array::from_f32(10000.0), &exponents)?)
    };
    freqs().map_err(|e| EngineError::load(LoadErrorKind::InvalidWeights, e.to_string()))
}

/// mlx-vlm's `rot_pos_emb`: each patch's (row, column) angles `(S, head_dim / 2)`, patches
/// in the processor's order (merge blocks row-major, row-major inside a block).
pub fn rotary_angles(
    grids: &[[usize; 3]],
    merge: usize,
    inv_freq: &Array,
) -> layers::Result<Array> {
    let m = merge;
    let mut ids: Vec<i32> = Vec::new();
    for &[t, h, w] in grids {
        let mut one = Vec::with_capacity(2 * h * w);
        for bh in 0..h / m {
            for bw in 0..w / m {
                for i in 0..m {
                    for j in 0..m {
                        one.extend([(bh * m + i) as i32, (bw * m + j) as i32]);
                    }
                }
            }
        }
        for _ in 0..t {
            ids.extend_from_slice(&one);
        }
    }
    let max_side = grids.iter().map(|g| g[1].max(g[2])).max().unwrap_or(0) as i32;
    let seq = ops::arange::<_, f32>(0.0, max_side as f32, 1.0)?;
    let table = seq
        .reshape(&[-1, 1])?
        .multiply(inv_freq.reshape(&[1, -1])?)?;
    let n = ids.len() as i32;
    table
        .take_axis(Array::from_slice(&ids, &[n]), 0)?
        .reshape(&[n / 2, -1])
}

/// cos and sin `(S, 1, head_dim)` of `angles` `(S, head_dim / 2)`: both axes' angles, twice.
pub fn rotary_cos_sin(angles: &Array) -> layers::Result<(Array, Array)> {
    let angles = ops::concatenate(&[angles, angles], -1)?.expand_dims(1)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// Cumulative ends of each image's patches (each temporal slice apart), mlx-vlm's
/// `cu_seqlens` without its leading 0.
pub fn image_bounds(grids: &[[usize; 3]]) -> Vec<i32> {
    let mut ends = Vec::new();
    let mut end = 0i32;
    for &[t, h, w] in grids {
        for _ in 0..t {
            end += (h * w) as i32;
            ends.push(end);
        }
    }
    ends
}
