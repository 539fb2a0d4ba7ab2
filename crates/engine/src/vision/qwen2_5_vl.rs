//! Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`), as mlx-vlm 0.7.0's `qwen2_5_vl` computes
//! it: a windowed vision transformer over 14 px patches of the processor's resized image (a
//! patch convolution, RMS-normed blocks with 2-D rotary attention inside windows, full attention
//! on `fullatt_block_indexes`), a patch merger (RMS norm, 2x2 patches concatenated, MLP with
//! exact GELU) into the language model's width, the features in place of `<|image_pad|>`
//! tokens (the processor repeats it `t * h * w / merge^2` times), and the language model
//! `models/qwen2_5_vl_text.rs` with multimodal RoPE at positions [`rope_index`] computes.
//!
//! Where mlx-vlm differs from transformers, this follows mlx-vlm (docs/decisions/vision.md):
//! the text config is config.json's top level; pixels are cast to the tower's dtype; the M-RoPE
//! angles are cast to the activations' dtype before the rotation.

use mlx_rs::{fast, ops, Array, Dtype};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    models::parse_args,
    nn::{self, gelu, rotate_half, Activation, Linear, RmsNorm},
    rope::MropePositions,
    vision::{ImageInputs, PromptTokens, VisionModel},
    weights::Weights,
};

#[derive(Debug, Deserialize)]
struct Args {
    vision_config: VisionArgs,
    #[serde(default = "default_image_token_id")]
    image_token_id: u32,
    #[serde(default = "default_vision_start_token_id")]
    vision_start_token_id: u32,
}

fn default_image_token_id() -> u32 {
    151_655
}
fn default_vision_start_token_id() -> u32 {
    151_652
}

/// `vision_config`, with mlx-vlm's defaults.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct VisionArgs {
    depth: usize,
    hidden_size: i32,
    num_heads: i32,
    patch_size: i32,
    in_channels: i32,
    spatial_merge_size: i32,
    temporal_patch_size: i32,
    window_size: i32,
    fullatt_block_indexes: Vec<usize>,
}

impl Default for VisionArgs {
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

/// The tokens the chat template writes per image; the processor repeats the pad.
const IMAGE_PAD: &str = "<|image_pad|>";

/// The language model's config: mlx-vlm reads the top level of config.json (transformers 5
/// checkpoints that keep the text settings only under `text_config` are read from there).
fn text_config(config: &Value) -> Value {
    let mut text = match config.get("hidden_size") {
        Some(_) => config.clone(),
        None => config.get("text_config").cloned().unwrap_or(json!({})),
    };
    if let Some(obj) = text.as_object_mut() {
        obj.remove("vision_config");
        obj.remove("text_config");
        obj.insert("model_type".into(), json!("qwen2_5_vl_text"));
    }
    text
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
        tower: &Tower,
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
        tower: &Tower,
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

struct Tower {
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
    args: VisionArgs,
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

impl Tower {
    fn load(args: VisionArgs, w: &mut Weights) -> Result<Self, EngineError> {
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
    fn forward(&self, pixels: &Array, grids: &[[usize; 3]]) -> nn::Result<Array> {
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

pub struct Qwen25Vision {
    tower: Tower,
    image_token_id: u32,
    vision_start_token_id: u32,
    processor: images::processors::QwenVlImageProcessor,
}

/// Splits a Qwen2.5-VL checkpoint: the vision tower built here, the language model's tensors
/// left in `weights` under mlx-lm's names; returns the language model's config.
pub fn load(
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(Qwen25Vision, Value), EngineError> {
    let args: Args = parse_args(config)?;
    let images::processors::Processor::QwenVl(processor) = processor else {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "Qwen2.5-VL needs a Qwen-VL image processor",
        ));
    };
    let vision = args.vision_config;
    if processor.merge_size as i32 != vision.spatial_merge_size
        || processor.patch_size as i32 != vision.patch_size
        || processor.temporal_patch_size as i32 != vision.temporal_patch_size
    {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "the image processor's patch {}/temporal {}/merge {} differ from the tower's \
                 {}/{}/{} (preprocessor_config.json vs config.json)",
                processor.patch_size,
                processor.temporal_patch_size,
                processor.merge_size,
                vision.patch_size,
                vision.temporal_patch_size,
                vision.spatial_merge_size
            ),
        ));
    }
    let mut tower_weights = split_parts(weights)?;
    let tower = Tower::load(vision, &mut tower_weights)?;
    if let Some(name) = tower_weights.names().next() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("unexpected tensor `{name}` in the vision tower"),
        ));
    }
    Ok((
        Qwen25Vision {
            tower,
            image_token_id: args.image_token_id,
            vision_start_token_id: args.vision_start_token_id,
            processor,
        },
        text_config(config),
    ))
}

/// Returns the vision tower's tensors (mlx-vlm's names under `vision_tower.`) and leaves the
/// language model's in `weights` under mlx-lm's names. transformers 5 saves `model.visual.*`,
/// `model.language_model.*`; Qwen's original checkpoints `visual.*`, `model.*`; mlx-vlm and
/// mlx-community `vision_tower.*`, `language_model.*`: all are read.
fn split_parts(weights: &mut Weights) -> Result<Weights, EngineError> {
    weights.rename_prefix("model.visual.", "vision_tower.");
    weights.rename_prefix("visual.", "vision_tower.");
    weights.rename_prefix("model.language_model.", "language_model.model.");
    weights.rename_prefix("model.", "language_model.model.");
    weights.rename_prefix("lm_head.", "language_model.lm_head.");
    let tower = weights.split_off("vision_tower.");
    let language = weights.split_off("language_model.");
    if let Some(name) = weights.names().next() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("tensor `{name}` belongs to no part of a Qwen2.5-VL model"),
        ));
    }
    *weights = language;
    Ok(tower)
}

impl Qwen25Vision {
    /// `[t, h, w]` in patches for each image, as the processor will make it.
    fn grids(&self, images: &[images::RgbImage]) -> Result<Vec<[usize; 3]>, EngineError> {
        let ps = self.processor.patch_size;
        images
            .iter()
            .map(|img| {
                let (h, w) = self
                    .processor
                    .target_size(img.height, img.width)
                    .map_err(|e| EngineError::InvalidParams {
                        field: "messages".into(),
                        reason: format!("preprocessing the images: {e}"),
                    })?;
                Ok([1, (h / ps) as usize, (w / ps) as usize])
            })
            .collect()
    }

    fn merge_unit(&self) -> usize {
        let m = self.tower.args.spatial_merge_size as usize;
        m * m
    }
}

impl VisionModel for Qwen25Vision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        let found = text.matches(IMAGE_PAD).count();
        if found != images.len() {
            return Err(EngineError::InvalidParams {
                field: "messages".into(),
                reason: format!(
                    "the prompt has {found} `{IMAGE_PAD}` placeholders for {} images (the chat \
                     template writes one per image part; do not write `{IMAGE_PAD}` in text)",
                    images.len()
                ),
            });
        }
        let counts: Vec<usize> = self
            .grids(images)?
            .iter()
            .map(|g| g[0] * g[1] * g[2] / self.merge_unit())
            .collect();
        let mut out = String::with_capacity(text.len());
        let mut pieces = text.split(IMAGE_PAD);
        out.push_str(pieces.next().unwrap_or_default());
        for (piece, &n) in pieces.zip(&counts) {
            out.push_str(&IMAGE_PAD.repeat(n));
            out.push_str(piece);
        }
        Ok(PromptTokens {
            text: out,
            tokens_per_image: counts,
        })
    }

    fn positions(
        &self,
        ids: &[u32],
        images: &[images::RgbImage],
    ) -> Result<Option<MropePositions>, EngineError> {
        let m = self.tower.args.spatial_merge_size as usize;
        let grids = self.grids(images)?;
        rope_index(
            ids,
            self.image_token_id,
            self.vision_start_token_id,
            &grids,
            m,
        )
        .map(Some)
    }

    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError> {
        let processor = images::processors::Processor::QwenVl(self.processor.clone());
        super::pixel_values(&processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, _dtype: Dtype) -> nn::Result<Array> {
        self.tower.forward(&inputs.pixel_values, &inputs.grid_thw)
    }

    fn merge(&self, ids: &[u32], embeds: Array, features: &Array) -> nn::Result<Array> {
        super::scatter_rows(ids, self.image_token_id, embeds, features)
    }
}

/// mlx-vlm's `get_rope_index` for one prompt of images: text tokens count on from the last
/// position on all three rows; the tokens of an image (those after a `<|vision_start|>`) take
/// (t, row, column) of its merged grid, offset by the position it starts at. `delta` is
/// `max + 1 - len`, what the tokens after the prompt add to their index.
fn rope_index(
    ids: &[u32],
    image_id: u32,
    start_id: u32,
    grids: &[[usize; 3]],
    merge: usize,
) -> Result<MropePositions, EngineError> {
    let images = ids
        .windows(2)
        .filter(|p| p[0] == start_id && p[1] == image_id)
        .count();
    if images > grids.len() {
        return Err(EngineError::InvalidParams {
            field: "messages".into(),
            reason: format!(
                "the prompt has {images} images' tokens for {} images (is an image token \
                 written in the text?)",
                grids.len()
            ),
        });
    }
    let mut rows: [Vec<i32>; 3] = Default::default();
    let mut next = 0i32; // one past the largest position so far
    let mut st = 0usize;
    let push_text = |rows: &mut [Vec<i32>; 3], next: &mut i32, n: usize| {
        for r in rows.iter_mut() {
            r.extend((0..n as i32).map(|i| *next + i));
        }
        *next += n as i32;
    };
    for &[t, h, w] in grids.iter().take(images) {
        let Some(ed) = ids[st..]
            .iter()
            .position(|&id| id == image_id)
            .map(|p| p + st)
        else {
            break;
        };
        push_text(&mut rows, &mut next, ed - st);
        let (lh, lw) = (h / merge, w / merge);
        let base = next;
        for ti in 0..t {
            for i in 0..lh {
                for j in 0..lw {
                    rows[0].push(base + ti as i32);
                    rows[1].push(base + i as i32);
                    rows[2].push(base + j as i32);
                }
            }
        }
        let max = (t.max(lh).max(lw) as i32 - 1).max(0);
        next = base + max + 1;
        st = ed + t * lh * lw;
    }
    if st < ids.len() {
        push_text(&mut rows, &mut next, ids.len() - st);
    }
    let delta = next - ids.len() as i32;
    Ok(MropePositions { rows, delta })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_splits_into_the_tower_and_mlx_lm_names() {
        let layouts = [
            [
                "model.visual.blocks.0.norm1.weight",
                "model.language_model.norm.weight",
                "lm_head.weight",
            ],
            [
                "visual.blocks.0.norm1.weight",
                "model.norm.weight",
                "lm_head.weight",
            ],
            [
                "vision_tower.blocks.0.norm1.weight",
                "language_model.model.norm.weight",
                "language_model.lm_head.weight",
            ],
        ];
        for names in layouts {
            let tensors = names.iter().map(|n| (n.to_string(), Array::from_f32(1.0)));
            let mut weights = Weights::from_tensors(tensors.collect(), &json!({}));
            let tower = split_parts(&mut weights).unwrap();
            assert_eq!(tower.names().collect::<Vec<_>>(), ["blocks.0.norm1.weight"]);
            let mut language: Vec<_> = weights.names().cloned().collect();
            language.sort();
            assert_eq!(
                language,
                ["lm_head.weight", "model.norm.weight"],
                "{names:?}"
            );
        }
        let tensors = [("mm_projector.weight".to_string(), Array::from_f32(1.0))];
        let mut weights = Weights::from_tensors(tensors.into_iter().collect(), &json!({}));
        assert!(split_parts(&mut weights).is_err());
    }

    #[test]
    fn the_text_config_is_the_top_level_or_else_text_config() {
        let top = json!({"hidden_size": 64, "vision_config": {}, "text_config": {"x": 1}});
        let text = text_config(&top);
        assert_eq!(text["hidden_size"], 64);
        assert_eq!(text["model_type"], "qwen2_5_vl_text");
        assert!(text.get("vision_config").is_none() && text.get("text_config").is_none());
        let nested = json!({"vision_config": {}, "text_config": {"hidden_size": 32}});
        assert_eq!(text_config(&nested)["hidden_size"], 32);
    }

    #[test]
    fn image_tokens_take_their_grid_positions_and_text_counts_on() {
        // 2 text, start, 4 image tokens (a 1x4x4 grid merged 2x2 -> 2x2), end, 1 text.
        let ids = [5, 6, 100, 9, 9, 9, 9, 101, 7];
        let p = rope_index(&ids, 9, 100, &[[1, 4, 4]], 2).unwrap();
        assert_eq!(p.rows[0], [0, 1, 2, 3, 3, 3, 3, 5, 6]);
        assert_eq!(p.rows[1], [0, 1, 2, 3, 3, 4, 4, 5, 6]);
        assert_eq!(p.rows[2], [0, 1, 2, 3, 4, 3, 4, 5, 6]);
        assert_eq!(p.delta, 7 - 9);
        // Past the prompt: index + delta on all rows.
        let tail = p.slice(8, 3).unwrap();
        assert_eq!(tail.as_slice::<i32>(), [6, 7, 8, 6, 7, 8, 6, 7, 8]);
    }

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
