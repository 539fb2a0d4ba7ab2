//! Qwen3-VL's vision transformer, as mlx-vlm 0.7.0's `qwen3_vl` `VisionModel` computes it: a
//! Conv3d with a bias over (temporal, p, p) patches plus learned position embeddings (a
//! `sqrt(num_position_embeddings)`-sided table, interpolated bilinearly to the patch grid);
//! blocks of LayerNorm, attention over each whole image with a fused `qkv` and 2-D rotary
//! embedding (`qwen_vit.rs`), and a tanh-GELU MLP; then the patch merger (LayerNorm, 2x2
//! patches concatenated, `Linear`, exact GELU, `Linear`). Deepstack: the outputs of the blocks
//! in `deepstack_visual_indexes` go through their own mergers (LayerNorm after the 2x2
//! concatenation), one feature set per first language layer. No windows: the features come
//! out in the processor's order.
//!
//! Qwen2-VL's tower (mlx-vlm's `qwen2_vl`) is the same without position embeddings or
//! deepstack: a bias-free convolution, quick GELU in the blocks' MLP (`mlp.fc1`, `mlp.fc2`,
//! `embed_dim * mlp_ratio` wide), the merger's weights under `ln_q`, `mlp.0`, `mlp.2`.

use mlx_rs::{ops, Array, Dtype};
use serde::Deserialize;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, gelu, gelu_approx, quick_gelu, LayerNorm, Linear},
    vision::qwen_vit::{self, PatchEmbed, VitAttention},
};

/// `vision_config`, with mlx-vlm's defaults.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub struct Vit3Config {
    pub depth: usize,
    pub hidden_size: i32,
    pub num_heads: i32,
    pub patch_size: i32,
    pub in_channels: i32,
    pub spatial_merge_size: i32,
    pub temporal_patch_size: i32,
    pub num_position_embeddings: i32,
    pub deepstack_visual_indexes: Vec<usize>,
}

impl Default for Vit3Config {
    fn default() -> Self {
        Self {
            depth: 32,
            hidden_size: 1280,
            num_heads: 16,
            patch_size: 14,
            in_channels: 3,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            num_position_embeddings: 2304,
            deepstack_visual_indexes: Vec::new(),
        }
    }
}

/// Qwen2-VL's `vision_config`, with mlx-vlm's defaults: `embed_dim` is the tower's width,
/// `hidden_size` the merger's output (the MLP's width is its weights').
#[derive(Debug, Deserialize)]
#[serde(default)]
pub struct Vit2Config {
    pub depth: usize,
    pub embed_dim: i32,
    pub num_heads: i32,
    pub patch_size: i32,
    pub in_channels: i32,
    pub spatial_merge_size: i32,
    pub temporal_patch_size: i32,
}

impl Default for Vit2Config {
    fn default() -> Self {
        Self {
            depth: 32,
            embed_dim: 1280,
            num_heads: 16,
            patch_size: 14,
            in_channels: 3,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
        }
    }
}

/// The sizes the family file checks against the image processor: (patch, temporal, merge).
#[derive(Debug, Clone, Copy)]
pub struct Patching {
    pub patch: i32,
    pub temporal: i32,
    pub merge: i32,
}

/// The weight names and activations that differ between Qwen2-VL's blocks and Qwen3-VL's.
pub struct Naming {
    fc1: &'static str,
    fc2: &'static str,
    act: fn(&Array) -> layers::Result<Array>,
    merger: [&'static str; 3],
    merger_act: fn(&Array) -> layers::Result<Array>,
}

pub const QWEN3: Naming = Naming {
    fc1: "mlp.linear_fc1",
    fc2: "mlp.linear_fc2",
    act: gelu_approx,
    merger: ["norm", "linear_fc1", "linear_fc2"],
    merger_act: gelu,
};

/// Qwen3-VL-MoE's tower, as mlx-vlm 0.7.0's `qwen3_vl_moe` builds it: Qwen3-VL's with the two
/// GELUs the other way round (exact in the blocks, tanh in the mergers).
pub const QWEN3_MOE: Naming = Naming {
    act: gelu,
    merger_act: gelu_approx,
    ..QWEN3
};

const QWEN2: Naming = Naming {
    fc1: "mlp.fc1",
    fc2: "mlp.fc2",
    act: quick_gelu,
    merger: ["ln_q", "mlp.0", "mlp.2"],
    merger_act: gelu,
};

/// mlx-vlm's vision LayerNorms are `nn.LayerNorm(..., eps=1e-6)`, whatever config.json says.
const NORM_EPS: f32 = 1e-6;

struct Block {
    norm1: LayerNorm,
    attn: VitAttention,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    act: fn(&Array) -> layers::Result<Array>,
}

impl Block {
    fn load(
        w: &mut Weights,
        p: &str,
        (hidden, heads): (i32, i32),
        names: &Naming,
    ) -> Result<Self, EngineError> {
        Ok(Self {
            norm1: w.layer_norm(&format!("{p}.norm1"), NORM_EPS)?,
            attn: VitAttention::load(w, &format!("{p}.attn"), hidden, heads)?,
            norm2: w.layer_norm(&format!("{p}.norm2"), NORM_EPS)?,
            fc1: w.linear(&format!("{p}.{}", names.fc1))?,
            fc2: w.linear(&format!("{p}.{}", names.fc2))?,
            act: names.act,
        })
    }

    fn forward(&self, x: &Array, rope: &(Array, Array), bounds: &[i32]) -> layers::Result<Array> {
        let h = x.add(self.attn.forward(&self.norm1.forward(x)?, rope, bounds)?)?;
        let m = (self.act)(&self.fc1.forward(&self.norm2.forward(&h)?)?)?;
        h.add(self.fc2.forward(&m)?)
    }
}

/// A patch merger: each 2x2 unit of patches concatenated, normed before (the main merger) or
/// after the concatenation (deepstack's), `Linear`, GELU (exact but in Qwen3-VL-MoE), `Linear`.
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    act: fn(&Array) -> layers::Result<Array>,
    postshuffle: bool,
}

impl Merger {
    fn load(
        w: &mut Weights,
        p: &str,
        names: &Naming,
        postshuffle: bool,
    ) -> Result<Self, EngineError> {
        let [norm, fc1, fc2] = names.merger;
        Ok(Self {
            norm: w.layer_norm(&format!("{p}.{norm}"), NORM_EPS)?,
            fc1: w.linear(&format!("{p}.{fc1}"))?,
            fc2: w.linear(&format!("{p}.{fc2}"))?,
            act: names.merger_act,
            postshuffle,
        })
    }

    fn forward(&self, x: &Array, width: i32) -> layers::Result<Array> {
        let x = match self.postshuffle {
            true => self.norm.forward(&x.reshape(&[-1, width])?)?,
            false => self.norm.forward(x)?.reshape(&[-1, width])?,
        };
        self.fc2.forward(&(self.act)(&self.fc1.forward(&x)?)?)
    }
}

pub struct Qwen3Vit {
    patch_embed: PatchEmbed,
    /// `(num_position_embeddings, hidden)`; Qwen2-VL has none.
    pos_embed: Option<Array>,
    blocks: Vec<Block>,
    merger: Merger,
    /// Per block index in `deepstack_visual_indexes`, its merger.
    deepstack: Vec<(usize, Merger)>,
    inv_freq: Array,
    pub patching: Patching,
}

impl Qwen3Vit {
    /// Qwen3-VL's tower (`names`: [`QWEN3`], or [`QWEN3_MOE`] for Qwen3-VL-MoE's).
    pub fn load(args: Vit3Config, w: &mut Weights, names: &Naming) -> Result<Self, EngineError> {
        let side = (args.num_position_embeddings as f64).sqrt() as i32;
        if side * side != args.num_position_embeddings || side < 1 {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "config.json: vision_config.num_position_embeddings {} is not a square",
                    args.num_position_embeddings
                ),
            ));
        }
        if let Some(&i) = args
            .deepstack_visual_indexes
            .iter()
            .find(|&&i| i >= args.depth)
        {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "config.json: deepstack_visual_indexes names block {i} of a {}-block tower",
                    args.depth
                ),
            ));
        }
        let patching = Patching {
            patch: args.patch_size,
            temporal: args.temporal_patch_size,
            merge: args.spatial_merge_size,
        };
        let shape = (args.hidden_size, args.num_heads);
        let mut tower =
            Self::blocks_and_merger(w, names, args.depth, shape, args.in_channels, patching)?;
        tower.pos_embed = Some(w.take("pos_embed.weight")?);
        tower.deepstack = args
            .deepstack_visual_indexes
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let p = format!("deepstack_merger_list.{k}");
                Ok((i, Merger::load(w, &p, names, true)?))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(tower)
    }

    /// Qwen2-VL's tower.
    pub fn load_qwen2(args: Vit2Config, w: &mut Weights) -> Result<Self, EngineError> {
        let patching = Patching {
            patch: args.patch_size,
            temporal: args.temporal_patch_size,
            merge: args.spatial_merge_size,
        };
        let shape = (args.embed_dim, args.num_heads);
        Self::blocks_and_merger(w, &QWEN2, args.depth, shape, args.in_channels, patching)
    }

    /// The patch embedding, the blocks and the merger: a tower without position embeddings or
    /// deepstack.
    fn blocks_and_merger(
        w: &mut Weights,
        names: &Naming,
        depth: usize,
        (hidden, heads): (i32, i32),
        in_channels: i32,
        patching: Patching,
    ) -> Result<Self, EngineError> {
        let blocks = (0..depth)
            .map(|i| Block::load(w, &format!("blocks.{i}"), (hidden, heads), names))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            patch_embed: PatchEmbed::load(w, in_channels, patching.temporal, patching.patch)?,
            pos_embed: None,
            blocks,
            merger: Merger::load(w, "merger", names, false)?,
            deepstack: Vec::new(),
            inv_freq: qwen_vit::inv_freq(hidden / heads)?,
            patching,
        })
    }

    /// Feature rows `(tokens, text hidden)` of `pixels` `(patches, c * t * p * p)` with their
    /// grids, in the processor's order, and the deepstack features (the same rows, one set
    /// per deepstack block, in block order).
    pub fn forward(
        &self,
        pixels: &Array,
        grids: &[[usize; 3]],
    ) -> layers::Result<(Array, Vec<Array>)> {
        let m = self.patching.merge;
        let width = self.patch_embed.hidden() * m * m;
        let mut x = self.patch_embed.forward(pixels)?;
        if let Some(table) = &self.pos_embed {
            x = x.add(position_embeddings(table, grids, m)?)?;
        }
        let angles = qwen_vit::rotary_angles(grids, m as usize, &self.inv_freq)?;
        let rope = qwen_vit::rotary_cos_sin(&angles)?;
        let bounds = qwen_vit::image_bounds(grids);
        let mut deepstack = Vec::new();
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, &rope, &bounds)?;
            if let Some((_, merger)) = self.deepstack.iter().find(|(b, _)| *b == i) {
                deepstack.push(merger.forward(&x, width)?);
            }
        }
        Ok((self.merger.forward(&x, width)?, deepstack))
    }
}

/// mlx-vlm's `fast_pos_embed_interpolate`: for each patch of a `h x w` grid, the table
/// rows around `linspace(0, side - 1, h)` x `linspace(0, side - 1, w)` weighted
/// bilinearly (the weights in float32, then in the table's dtype), in the processor's
/// patch order.
fn position_embeddings(table: &Array, grids: &[[usize; 3]], m: i32) -> layers::Result<Array> {
    let side = (table.dim(0) as f64).sqrt() as i32;
    let dtype = table.dtype();
    let mut per_image = Vec::with_capacity(grids.len());
    for &[t, h, w] in grids {
        let (h, w) = (h as i32, w as i32);
        let axis = |n: i32| -> layers::Result<(Array, Array, Array)> {
            let count = ops::LinspaceOptions {
                count: n,
                endpoint: true,
            };
            let idx = ops::linspace::<f32, f32>(0.0, (side - 1) as f32, count)?;
            let floor = idx.as_dtype(Dtype::Int32)?;
            let ceil = ops::minimum(floor.add(Array::from_int(1))?, Array::from_int(side - 1))?;
            let frac = idx.subtract(floor.as_dtype(Dtype::Float32)?)?;
            Ok((floor, ceil, frac))
        };
        let (hf, hc, dh) = axis(h)?;
        let (wf, wc, dw) = axis(w)?;
        let side_a = Array::from_int(side);
        let rows = |r: &Array| -> layers::Result<Array> { r.multiply(&side_a)?.reshape(&[-1, 1]) };
        let cols = |c: &Array| c.reshape(&[1, -1]);
        let one = Array::from_f32(1.0);
        let (ndh, ndw) = (one.subtract(&dh)?, one.subtract(&dw)?);
        let outer = |a: &Array, b: &Array| -> layers::Result<Array> {
            a.reshape(&[-1, 1])?.multiply(b.reshape(&[1, -1])?)
        };
        let corners = [
            (rows(&hf)?.add(cols(&wf)?)?, outer(&ndh, &ndw)?),
            (rows(&hf)?.add(cols(&wc)?)?, outer(&ndh, &dw)?),
            (rows(&hc)?.add(cols(&wf)?)?, outer(&dh, &ndw)?),
            (rows(&hc)?.add(cols(&wc)?)?, outer(&dh, &dw)?),
        ];
        let mut sum: Option<Array> = None;
        for (idx, weight) in &corners {
            let term = table
                .take_axis(idx.reshape(&[-1])?, 0)?
                .multiply(weight.reshape(&[-1, 1])?.as_dtype(dtype)?)?;
            sum = Some(match sum {
                Some(s) => s.add(&term)?,
                None => term,
            });
        }
        let d = table.dim(1);
        let grid = sum.expect("four corners").reshape(&[1, h, w, d])?;
        let grid = ops::broadcast_to(&grid, &[t as i32, h, w, d])?;
        per_image.push(
            grid.reshape(&[t as i32, h / m, m, w / m, m, d])?
                .transpose_axes(&[0, 1, 3, 2, 4, 5])?
                .reshape(&[-1, d])?,
        );
    }
    ops::concatenate(&per_image, 0)
}
