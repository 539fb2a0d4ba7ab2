//! Qwen2.5-VL's vision transformer, as mlx-vlm 0.7.0's `qwen2_5_vl` `VisionModel` computes it:
//! a bias-free Conv3d over (temporal, 14, 14) patches; blocks of RMS norm, attention with a fused
//! `qkv` and 2-D rotary embedding (each patch's row and column angles) within windows of merged
//! patches, or over the whole image on `fullatt_block_indexes`, and a SwiGLU MLP; then the patch
//! merger (RMS norm, 2x2 patches concatenated, `Linear`, exact GELU, `Linear`). The patches run
//! window by window and the merged features come back in the processor's order.

use mlx_rs::{fast, ops, Array};
use serde::Deserialize;

use crate::{
    error::{EngineError, LoadErrorKind},
    nn::{self, gelu, rotate_half, Activation, Linear, RmsNorm},
    weights::Weights,
};

/// `vision_config`, with mlx-vlm's defaults.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub struct VitConfig {
    pub depth: usize,
    pub hidden_size: i32,
    pub num_heads: i32,
    pub patch_size: i32,
    pub in_channels: i32,
    pub spatial_merge_size: i32,
    pub temporal_patch_size: i32,
    pub window_size: i32,
    pub fullatt_block_indexes: Vec<usize>,
}

impl Default for VitConfig {
    fn default() -> Self {
        Self {
            depth: 32,
            hidden_size: 1280,
            num_heads: 16,
            patch_size: 14,
            in_channels: 3,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            window_size: 112,
            fullatt_block_indexes: vec![7, 15, 23, 31],
        }
    }
}

/// A vision block: RMS norms (eps 1e-6), attention with a fused `qkv`, a SwiGLU MLP.
struct Block {
    norm1: RmsNorm,
    qkv: Linear,
    proj: Linear,
    norm2: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// Attends over the whole image rather than within windows.
    full: bool,
}

/// mlx-vlm's vision RMS norms are `nn.RMSNorm(hidden, eps=1e-6)`, whatever config.json says.
const NORM_EPS: f32 = 1e-6;

impl Block {
    fn load(w: &mut Weights, p: &str, full: bool) -> Result<Self, EngineError> {
        Ok(Self {
            norm1: w.rms_norm(&format!("{p}.norm1"), NORM_EPS)?,
            qkv: w.linear(&format!("{p}.attn.qkv"))?,
            proj: w.linear(&format!("{p}.attn.proj"))?,
            norm2: w.rms_norm(&format!("{p}.norm2"), NORM_EPS)?,
            gate_proj: w.linear(&format!("{p}.mlp.gate_proj"))?,
            up_proj: w.linear(&format!("{p}.mlp.up_proj"))?,
            down_proj: w.linear(&format!("{p}.mlp.down_proj"))?,
            full,
        })
    }

    fn forward(
        &self,
        x: &Array,
        tower: &QwenVit,
        rope: &(Array, Array),
        bounds: &Bounds,
    ) -> nn::Result<Array> {
        let bounds = match self.full {
            true => &bounds.images,
            false => &bounds.windows,
        };
        let h = x.add(self.attention(&self.norm1.forward(x)?, tower, rope, bounds)?)?;
        let n = self.norm2.forward(&h)?;
        let gated =
            Activation::Silu.gated(&self.gate_proj.forward(&n)?, &self.up_proj.forward(&n)?)?;
        h.add(self.down_proj.forward(&gated)?)
    }

    /// Attention of `x` `(S, D)` within each span of `bounds` (cumulative ends).
    fn attention(
        &self,
        x: &Array,
        tower: &QwenVit,
        rope: &(Array, Array),
        bounds: &[i32],
    ) -> nn::Result<Array> {
        let s = x.dim(0);
        let qkv = self
            .qkv
            .forward(x)?
            .reshape(&[s, 3, tower.heads, -1])?
            .transpose_axes(&[1, 0, 2, 3])?;
        let parts = qkv.split_equal(3, 0)?;
        // mlx-vlm's `apply_rotary_pos_emb_vision`: in float32 (cos/sin are), cast back.
        let rotate = |t: &Array| -> nn::Result<Array> {
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
            outs.push(fast::scaled_dot_product_attention(
                q,
                k,
                v,
                tower.scale,
                None,
                None,
            )?);
        }
        let o = ops::concatenate(&outs, 2)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[s, -1])?;
        self.proj.forward(&o)
    }
}

/// Cumulative ends of the attention spans, over the patches in window order.
struct Bounds {
    /// Each image (each temporal slice) whole.
    images: Vec<i32>,
    /// Each window, empty ones left out.
    windows: Vec<i32>,
}

pub struct QwenVit {
    /// `(hidden, t, p, p, channels)`: MLX's convolution layout.
    patch_weight: Array,
    blocks: Vec<Block>,
    merger_norm: RmsNorm,
    merger_fc1: Linear,
    merger_fc2: Linear,
    /// `1 / 10000^(2i / (head_dim / 2))`, float32: the 2-D rotary frequencies.
    inv_freq: Array,
    heads: i32,
    scale: f32,
    pub args: VitConfig,
}

/// A Conv3d weight in MLX's `(out, t, p, p, in)` layout; PyTorch's `(out, in, t, p, p)` is
/// transposed (mlx-vlm's `check_array_shape` decides which it is).
fn conv3d_weight(w: Array) -> nn::Result<Array> {
    let s = w.shape();
    let mlx_layout = s.len() == 5 && (s[4] == 3 || (s[1] >= s[2] && s[1] >= s[3] && s[2] == s[3]));
    match mlx_layout {
        true => Ok(w),
        false => w.transpose_axes(&[0, 2, 3, 4, 1]),
    }
}

impl QwenVit {
    pub fn load(args: VitConfig, w: &mut Weights) -> Result<Self, EngineError> {
        let mut blocks = Vec::with_capacity(args.depth);
        for i in 0..args.depth {
            let full = args.fullatt_block_indexes.contains(&i);
            blocks.push(Block::load(w, &format!("blocks.{i}"), full)?);
        }
        let head_dim = args.hidden_size / args.num_heads;
        let dim = head_dim / 2;
        let inv_freq = || -> nn::Result<Array> {
            let exponents = Array::arange::<f32, f32>(0.0, dim as f32, 2.0)?
                .divide(Array::from_f32(dim as f32))?;
            Array::from_f32(1.0).divide(ops::power(Array::from_f32(10000.0), &exponents)?)
        };
        let invalid = |e: mlx_rs::error::Exception| {
            EngineError::load(LoadErrorKind::InvalidWeights, e.to_string())
        };
        Ok(Self {
            patch_weight: conv3d_weight(w.take("patch_embed.proj.weight")?).map_err(invalid)?,
            blocks,
            merger_norm: w.rms_norm("merger.ln_q", NORM_EPS)?,
            merger_fc1: w.linear("merger.mlp.0")?,
            merger_fc2: w.linear("merger.mlp.2")?,
            inv_freq: inv_freq().map_err(invalid)?,
            heads: args.num_heads,
            scale: (head_dim as f64).powf(-0.5) as f32,
            args,
        })
    }

    /// Feature rows `(tokens, text hidden)` of `pixels` `(patches, c * t * p * p)` with their
    /// grids, in the processor's (and the prompt's) order.
    pub fn forward(&self, pixels: &Array, grids: &[[usize; 3]]) -> nn::Result<Array> {
        let a = &self.args;
        let unit = a.spatial_merge_size * a.spatial_merge_size;
        let hidden = self.patch_weight.dim(0);
        let x = pixels
            .as_dtype(self.patch_weight.dtype())?
            .reshape(&[
                -1,
                a.in_channels,
                a.temporal_patch_size,
                a.patch_size,
                a.patch_size,
            ])?
            .move_axis(1, 4)?;
        let kernel = (a.temporal_patch_size, a.patch_size, a.patch_size);
        let x = ops::conv3d(&x, &self.patch_weight, kernel, None, None, None)?
            .reshape(&[-1, hidden])?;
        let s = x.dim(0);
        let layout = WindowLayout::new(
            grids,
            a.spatial_merge_size,
            a.window_size / a.spatial_merge_size / a.patch_size,
        );
        let order = Array::from_slice(&layout.order, &[layout.order.len() as i32]);
        let in_windows = |t: &Array| -> nn::Result<Array> {
            t.reshape(&[s / unit, unit, -1])?
                .take_axis(&order, 0)?
                .reshape(&[s, -1])
        };
        let mut x = in_windows(&x)?;
        let angles = in_windows(&self.rotary_angles(grids)?)?;
        // cos/sin `(S, 1, head_dim)`: the angles of both axes, twice.
        let angles = ops::concatenate(&[&angles, &angles], -1)?.expand_dims(1)?;
        let rope = (angles.cos()?, angles.sin()?);
        for block in &self.blocks {
            x = block.forward(&x, self, &rope, &layout.bounds)?;
        }
        let merged = self
            .merger_norm
            .forward(&x)?
            .reshape(&[-1, hidden * unit])?;
        let merged = self
            .merger_fc2
            .forward(&gelu(&self.merger_fc1.forward(&merged)?)?)?;
        let mut reverse = vec![0i32; layout.order.len()];
        for (i, &o) in layout.order.iter().enumerate() {
            reverse[o as usize] = i as i32;
        }
        merged.take_axis(Array::from_slice(&reverse, &[reverse.len() as i32]), 0)
    }

    /// mlx-vlm's `rot_pos_emb`: each patch's (row, column) angles `(S, head_dim / 2)`, patches
    /// in the processor's order (2x2 merge blocks row-major, row-major inside a block).
    fn rotary_angles(&self, grids: &[[usize; 3]]) -> nn::Result<Array> {
        let m = self.args.spatial_merge_size as usize;
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
            .multiply(self.inv_freq.reshape(&[1, -1])?)?;
        let n = ids.len() as i32;
        table
            .take_axis(Array::from_slice(&ids, &[n]), 0)?
            .reshape(&[n / 2, -1])
    }
}

/// mlx-vlm's `get_window_index`: the merged patches (each a 2x2 block) regrouped window by
/// window (windows of `win` x `win` merged patches, row-major, the grid padded at the bottom
/// and right), and the attention spans in that order.
struct WindowLayout {
    /// The merged patches in window order (indices into the processor's order).
    order: Vec<i32>,
    bounds: Bounds,
}

impl WindowLayout {
    fn new(grids: &[[usize; 3]], merge: i32, win: i32) -> Self {
        let (m, win) = (merge as usize, win.max(1) as usize);
        let unit = (m * m) as i32;
        let (mut order, mut windows, mut images) = (Vec::new(), vec![0i32], vec![0i32]);
        let mut base = 0usize;
        for &[t, h, w] in grids {
            let (lh, lw) = (h / m, w / m);
            // mlx-vlm pads by `win - n % win`: a whole empty window when `win` divides `n`.
            let (nh, nw) = ((lh + win - lh % win) / win, (lw + win - lw % win) / win);
            for ti in 0..t {
                for wh in 0..nh {
                    for ww in 0..nw {
                        let mut count = 0;
                        for i in wh * win..(wh + 1) * win {
                            for j in ww * win..(ww + 1) * win {
                                if i < lh && j < lw {
                                    order.push((base + ti * lh * lw + i * lw + j) as i32);
                                    count += 1;
                                }
                            }
                        }
                        let end = windows.last().copied().unwrap_or(0) + count * unit;
                        if count > 0 {
                            windows.push(end);
                        }
                    }
                }
                images.push(images.last().copied().unwrap_or(0) + (h * w) as i32);
            }
            base += t * lh * lw;
        }
        windows.remove(0);
        images.remove(0);
        WindowLayout {
            order,
            bounds: Bounds { images, windows },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_merged_grid_once_with_padding_windows_dropped() {
        // A 6x8 patch grid: 3x4 merged patches, windows of 2x2 merged patches.
        let layout = WindowLayout::new(&[[1, 6, 8]], 2, 2);
        let mut sorted = layout.order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..12).collect::<Vec<i32>>());
        assert_eq!(&layout.order[..4], [0, 1, 4, 5]);
        // Windows of 4, 4, 2, 2 merged patches (x4 patches each); the padded row is partial.
        assert_eq!(layout.bounds.windows, [16, 32, 40, 48]);
        assert_eq!(layout.bounds.images, [48]);
    }
}
