//! Qwen2.5-VL's vision transformer, as mlx-vlm 0.7.0's `qwen2_5_vl` `VisionModel` computes it:
//! a bias-free Conv3d over (temporal, 14, 14) patches; blocks of RMS norm, attention with a fused
//! `qkv` and 2-D rotary embedding (`qwen_vit.rs`) within windows of merged patches, or over the
//! whole image on `fullatt_block_indexes`, and a SwiGLU MLP; then the patch merger (RMS norm,
//! 2x2 patches concatenated, `Linear`, exact GELU, `Linear`). The patches run window by window
//! and the merged features come back in the processor's order.

use mlx_rs::Array;
use serde::Deserialize;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::{self, gelu, Activation, Linear, RmsNorm},
    vision::qwen_vit::{self, PatchEmbed, VitAttention},
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
    attn: VitAttention,
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
    fn load(w: &mut Weights, p: &str, args: &VitConfig, full: bool) -> Result<Self, EngineError> {
        Ok(Self {
            norm1: w.rms_norm(&format!("{p}.norm1"), NORM_EPS)?,
            attn: VitAttention::load(w, &format!("{p}.attn"), args.hidden_size, args.num_heads)?,
            norm2: w.rms_norm(&format!("{p}.norm2"), NORM_EPS)?,
            gate_proj: w.linear(&format!("{p}.mlp.gate_proj"))?,
            up_proj: w.linear(&format!("{p}.mlp.up_proj"))?,
            down_proj: w.linear(&format!("{p}.mlp.down_proj"))?,
            full,
        })
    }

    fn forward(&self, x: &Array, rope: &(Array, Array), bounds: &Bounds) -> layers::Result<Array> {
        let bounds = match self.full {
            true => &bounds.images,
            false => &bounds.windows,
        };
        let h = x.add(self.attn.forward(&self.norm1.forward(x)?, rope, bounds)?)?;
        let n = self.norm2.forward(&h)?;
        let gated =
            Activation::Silu.gated(&self.gate_proj.forward(&n)?, &self.up_proj.forward(&n)?)?;
        h.add(self.down_proj.forward(&gated)?)
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
    patch_embed: PatchEmbed,
    blocks: Vec<Block>,
    merger_norm: RmsNorm,
    merger_fc1: Linear,
    merger_fc2: Linear,
    /// The 2-D rotary frequencies.
    inv_freq: Array,
    pub args: VitConfig,
}

impl QwenVit {
    pub fn load(args: VitConfig, w: &mut Weights) -> Result<Self, EngineError> {
        let mut blocks = Vec::with_capacity(args.depth);
        for i in 0..args.depth {
            let full = args.fullatt_block_indexes.contains(&i);
            blocks.push(Block::load(w, &format!("blocks.{i}"), &args, full)?);
        }
        Ok(Self {
            patch_embed: PatchEmbed::load(
                w,
                args.in_channels,
                args.temporal_patch_size,
                args.patch_size,
            )?,
            blocks,
            merger_norm: w.rms_norm("merger.ln_q", NORM_EPS)?,
            merger_fc1: w.linear("merger.mlp.0")?,
            merger_fc2: w.linear("merger.mlp.2")?,
            inv_freq: qwen_vit::inv_freq(args.hidden_size / args.num_heads)?,
            args,
        })
    }

    /// Feature rows `(tokens, text hidden)` of `pixels` `(patches, c * t * p * p)` with their
    /// grids, in the processor's (and the prompt's) order.
    pub fn forward(&self, pixels: &Array, grids: &[[usize; 3]]) -> layers::Result<Array> {
        let a = &self.args;
        let unit = a.spatial_merge_size * a.spatial_merge_size;
        let hidden = self.patch_embed.hidden();
        let x = self.patch_embed.forward(pixels)?;
        let s = x.dim(0);
        let layout = WindowLayout::new(
            grids,
            a.spatial_merge_size,
            a.window_size / a.spatial_merge_size / a.patch_size,
        );
        let order = Array::from_slice(&layout.order, &[layout.order.len() as i32]);
        let in_windows = |t: &Array| -> layers::Result<Array> {
            t.reshape(&[s / unit, unit, -1])?
                .take_axis(&order, 0)?
                .reshape(&[s, -1])
        };
        let mut x = in_windows(&x)?;
        let merge = a.spatial_merge_size as usize;
        let angles = qwen_vit::rotary_angles(grids, merge, &self.inv_freq)?;
        let rope = qwen_vit::rotary_cos_sin(&in_windows(&angles)?)?;
        for block in &self.blocks {
            x = block.forward(&x, &rope, &layout.bounds)?;
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
        let (mut order, mut windows) = (Vec::new(), vec![0i32]);
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
            }
            base += t * lh * lw;
        }
        windows.remove(0);
        WindowLayout {
            order,
            bounds: Bounds {
                images: qwen_vit::image_bounds(grids),
                windows,
            },
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
