//! Qwen2-VL (`Qwen2VLForConditionalGeneration`), Qwen2.5-VL
//! (`Qwen2_5_VLForConditionalGeneration`) and Qwen3-VL (`Qwen3VLForConditionalGeneration`), as
//! mlx-vlm 0.7.0's `qwen2_vl`, `qwen2_5_vl` and `qwen3_vl` compute them: a vision transformer
//! (`qwen2_5_vit.rs`, windowed; `qwen3_vit.rs`, Qwen3-VL's with deepstack and Qwen2-VL's) over
//! the processor's resized image, the features in place of `<|image_pad|>` tokens (the
//! processor repeats it `t * h * w / merge^2` times), and the language model
//! (`models/qwen2_5_vl_text.rs` for Qwen2-VL and Qwen2.5-VL, `models/qwen3_vl_text.rs`) with
//! multimodal RoPE at the positions [`rope_index`] computes for the whole prompt (the same for
//! the three families).
//!
//! Where mlx-vlm differs from transformers, this follows mlx-vlm (docs/decisions/vision.md):
//! Qwen2-VL's and Qwen2.5-VL's text config is config.json's top level; pixels are cast to the
//! tower's dtype.

use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers,
    layers::mrope::MropePositions,
    layers::weights::Weights,
    models::parse_args,
    vision::{
        model::PromptTokens,
        model::VisionModel,
        qwen2_5_vit::{QwenVit, VitConfig},
        qwen3_vit::{self, Patching, Qwen3Vit, Vit2Config, Vit3Config},
        shared::ImageInputs,
    },
};

/// Which Qwen-VL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen2,
    Qwen25,
    Qwen3,
    Qwen3Moe,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2-VL",
            Family::Qwen25 => "Qwen2.5-VL",
            Family::Qwen3 => "Qwen3-VL",
            Family::Qwen3Moe => "Qwen3-VL-MoE",
        }
    }
}

#[derive(Debug, Deserialize)]
struct Args<V> {
    vision_config: V,
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

/// The tokens the chat template writes per image; the processor repeats the pad.
const IMAGE_PAD: &str = "<|image_pad|>";

/// The language model's config. Qwen2-VL and Qwen2.5-VL: mlx-vlm reads the top level of
/// config.json (transformers 5 checkpoints that keep the text settings only under
/// `text_config` are read from there); Qwen2-VL's defaults where it is silent (its
/// `TextConfig`'s: 8 KV heads, 40960 positions, an untied head) are written in. Qwen3-VL:
/// `text_config`, as mlx-vlm reads it.
fn text_config(family: Family, config: &Value) -> Value {
    let nested = config.get("text_config").cloned().unwrap_or(json!({}));
    let top_or_nested = match config.get("hidden_size") {
        Some(_) => config.clone(),
        None => nested.clone(),
    };
    let (mut text, model_type) = match family {
        Family::Qwen2 | Family::Qwen25 => (top_or_nested, "qwen2_5_vl_text"),
        Family::Qwen3 => (nested, "qwen3_vl_text"),
        Family::Qwen3Moe => (nested, "qwen3_vl_moe_text"),
    };
    if let Some(obj) = text.as_object_mut() {
        obj.remove("vision_config");
        obj.remove("text_config");
        obj.insert("model_type".into(), json!(model_type));
        if family == Family::Qwen2 {
            let defaults = [
                ("num_key_value_heads", json!(8)),
                ("max_position_embeddings", json!(40960)),
                ("tie_word_embeddings", json!(false)),
            ];
            for (key, value) in defaults {
                obj.entry(key).or_insert(value);
            }
        }
    }
    text
}

/// The vision transformer of each family.
enum Tower {
    /// Qwen2.5-VL's.
    Windowed(QwenVit),
    /// Qwen2-VL's and Qwen3-VL's: each image whole.
    Whole(Qwen3Vit),
}

impl Tower {
    fn patching(&self) -> Patching {
        match self {
            Tower::Windowed(t) => Patching {
                patch: t.args.patch_size,
                temporal: t.args.temporal_patch_size,
                merge: t.args.spatial_merge_size,
            },
            Tower::Whole(t) => t.patching,
        }
    }

    fn merge_size(&self) -> usize {
        self.patching().merge as usize
    }
}

pub struct QwenVlVision {
    tower: Tower,
    image_token_id: u32,
    vision_start_token_id: u32,
    processor: images::processors::QwenVlImageProcessor,
}

/// Splits a Qwen-VL checkpoint: the vision tower built here, the language model's tensors
/// left in `weights` under mlx-lm's names; returns the language model's config.
pub fn load(
    family: Family,
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(QwenVlVision, Value), EngineError> {
    let images::processors::Processor::QwenVl(processor) = processor else {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("{} needs a Qwen-VL image processor", family.name()),
        ));
    };
    let mut tower_weights = split_parts(weights, family.name())?;
    let (tower, image_token_id, vision_start_token_id) = match family {
        Family::Qwen2 => {
            let args: Args<Vit2Config> = parse_args(config)?;
            let tower = Qwen3Vit::load_qwen2(args.vision_config, &mut tower_weights)?;
            (
                Tower::Whole(tower),
                args.image_token_id,
                args.vision_start_token_id,
            )
        }
        Family::Qwen25 => {
            let args: Args<VitConfig> = parse_args(config)?;
            let tower = QwenVit::load(args.vision_config, &mut tower_weights)?;
            (
                Tower::Windowed(tower),
                args.image_token_id,
                args.vision_start_token_id,
            )
        }
        Family::Qwen3 | Family::Qwen3Moe => {
            let args: Args<Vit3Config> = parse_args(config)?;
            let names = match family {
                Family::Qwen3Moe => &qwen3_vit::QWEN3_MOE,
                _ => &qwen3_vit::QWEN3,
            };
            let tower = Qwen3Vit::load(args.vision_config, &mut tower_weights, names)?;
            (
                Tower::Whole(tower),
                args.image_token_id,
                args.vision_start_token_id,
            )
        }
    };
    let Patching {
        patch,
        temporal,
        merge,
    } = tower.patching();
    if processor.merge_size as i32 != merge
        || processor.patch_size as i32 != patch
        || processor.temporal_patch_size as i32 != temporal
    {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "the image processor's patch {}/temporal {}/merge {} differ from the tower's \
                 {patch}/{temporal}/{merge} (preprocessor_config.json vs config.json)",
                processor.patch_size, processor.temporal_patch_size, processor.merge_size,
            ),
        ));
    }
    if let Some(name) = tower_weights.names().next() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("unexpected tensor `{name}` in the vision tower"),
        ));
    }
    Ok((
        QwenVlVision {
            tower,
            image_token_id,
            vision_start_token_id,
            processor,
        },
        text_config(family, config),
    ))
}

/// Returns the vision tower's tensors (mlx-vlm's names under `vision_tower.`) and leaves the
/// language model's in `weights` under mlx-lm's names. transformers 5 saves `model.visual.*`,
/// `model.language_model.*`; Qwen's original checkpoints `visual.*`, `model.*`; mlx-vlm and
/// mlx-community `vision_tower.*`, `language_model.*`: all are read.
fn split_parts(weights: &mut Weights, family: &str) -> Result<Weights, EngineError> {
    weights.rename_prefix("model.visual.", "vision_tower.");
    weights.rename_prefix("visual.", "vision_tower.");
    weights.rename_prefix("model.language_model.", "language_model.model.");
    weights.rename_prefix("model.", "language_model.model.");
    weights.rename_prefix("lm_head.", "language_model.lm_head.");
    let tower = weights.split_off("vision_tower.");
    let language = weights.split_off("language_model.");
    super::shared::keep_language(weights, language, family)?;
    Ok(tower)
}

impl QwenVlVision {
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
        let m = self.tower.merge_size();
        m * m
    }
}

impl VisionModel for QwenVlVision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        super::shared::check_placeholders(text, IMAGE_PAD, images.len())?;
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
        let m = self.tower.merge_size();
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
        super::shared::pixel_values(&processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, dtype: Dtype) -> layers::Result<Array> {
        Ok(self.encode_with_deepstack(inputs, dtype)?.0)
    }

    fn encode_with_deepstack(
        &self,
        inputs: &ImageInputs,
        _dtype: Dtype,
    ) -> layers::Result<(Array, Vec<Array>)> {
        let (pixels, grids) = (&inputs.pixel_values, &inputs.grid_thw);
        match &self.tower {
            Tower::Windowed(t) => Ok((t.forward(pixels, grids)?, Vec::new())),
            Tower::Whole(t) => t.forward(pixels, grids),
        }
    }

    fn merge(&self, ids: &[u32], embeds: Array, features: &Array) -> layers::Result<Array> {
        super::shared::scatter_rows(ids, self.image_token_id, embeds, features)
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
            let tower = split_parts(&mut weights, "Qwen2.5-VL").unwrap();
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
        assert!(split_parts(&mut weights, "Qwen2.5-VL").is_err());
    }

    #[test]
    fn the_text_config_is_the_top_level_or_else_text_config() {
        let top = json!({"hidden_size": 64, "vision_config": {}, "text_config": {"x": 1}});
        let text = text_config(Family::Qwen25, &top);
        assert_eq!(text["hidden_size"], 64);
        assert_eq!(text["model_type"], "qwen2_5_vl_text");
        assert!(text.get("vision_config").is_none() && text.get("text_config").is_none());
        let nested = json!({"vision_config": {}, "text_config": {"hidden_size": 32}});
        assert_eq!(text_config(Family::Qwen25, &nested)["hidden_size"], 32);
        // Qwen2-VL: the top level, with its `TextConfig`'s defaults where it is silent.
        let qwen2 = text_config(
            Family::Qwen2,
            &json!({"hidden_size": 64, "rope_theta": 1.0}),
        );
        assert_eq!(qwen2["num_key_value_heads"], 8);
        assert_eq!(qwen2["tie_word_embeddings"], false);
        assert_eq!(qwen2["rope_theta"], 1.0);
        let tied = json!({"hidden_size": 64, "tie_word_embeddings": true});
        assert_eq!(
            text_config(Family::Qwen2, &tied)["tie_word_embeddings"],
            true
        );
        // Qwen3-VL: `text_config` only, as mlx-vlm reads it.
        let qwen3 = text_config(Family::Qwen3, &top);
        assert_eq!(qwen3, json!({"x": 1, "model_type": "qwen3_vl_text"}));
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
}
