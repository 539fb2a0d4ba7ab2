//! Idefics3 and SmolVLM / SmolVLM2 (`Idefics3ForConditionalGeneration`,
//! `SmolVLMForConditionalGeneration`), as mlx-vlm 0.7.0's `idefics3` computes both (its
//! `smolvlm` is the same model with other config defaults and processor): each image is cut into
//! tiles plus a global image (`crates/images`' Idefics3 processor), every tile goes through a
//! SigLIP tower (`siglip.rs`) whose patches take mlx-vlm's bucketed position ids, the connector
//! pixel-shuffles `scale_factor`² neighbouring patches into one token and projects it
//! (`modality_projection`, no bias), and the features replace the `<image>` tokens the
//! processor's expansion wrote, unscaled. The language model is `models/llama.rs` with mlx-vlm's
//! idefics3 `TextConfig` (see [`text_config`]).
//!
//! The two families differ only in data: config.json defaults ([`Family`]), the processor
//! files (tile sizes, `image_seq_len`) and the chat template.

use std::path::Path;

use mlx_rs::{ops, Array, Dtype};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, Linear},
    models::parse_args,
    vision::{
        model::PromptTokens,
        model::VisionModel,
        shared::ImageInputs,
        siglip::{SiglipConfig, SiglipTower},
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    text_config: Value,
    #[serde(default)]
    vision_config: Value,
    #[serde(default = "default_scale_factor")]
    scale_factor: i32,
    #[serde(default = "default_image_token_id")]
    image_token_id: u32,
    image_token_index: Option<u32>,
}

fn default_scale_factor() -> i32 {
    2
}
fn default_image_token_id() -> u32 {
    49153
}

/// `processor_config.json`: image tokens per tile (mlx-vlm's processors default to 169).
#[derive(Debug, Default, Deserialize)]
struct ProcessorArgs {
    image_seq_len: Option<usize>,
}

/// The processor's expansion tokens (mlx-vlm's Idefics3 processor fixes them; its SmolVLM one
/// reads them from the tokenizer, whose defaults they are).
const FAKE: &str = "<fake_token_around_image>";
const IMAGE: &str = "<image>";
const GLOBAL: &str = "<global-img>";

/// Which of the two model types: they differ in config.json's defaults only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Idefics3,
    SmolVlm,
}

impl Family {
    /// mlx-vlm's `VisionConfig` defaults for what `vision_config` leaves out.
    fn vision_defaults(self, vision: &mut Map<String, Value>) {
        fn put(vision: &mut Map<String, Value>, k: &str, v: Value) {
            if vision.get(k).is_none_or(Value::is_null) {
                vision.insert(k.into(), v);
            }
        }
        match self {
            Family::Idefics3 => {
                put(vision, "num_hidden_layers", json!(12));
                put(vision, "image_size", json!(224));
            }
            Family::SmolVlm => {
                put(vision, "hidden_size", json!(1152));
                put(vision, "patch_size", json!(14));
                put(vision, "image_size", json!(384));
                let hidden = vision["hidden_size"].as_i64().unwrap_or(1152);
                let heads = if hidden % 64 == 0 { hidden / 64 } else { 16 };
                put(vision, "num_attention_heads", json!(heads));
                let layers = if hidden <= 768 { 12 } else { 27 };
                put(vision, "num_hidden_layers", json!(layers));
            }
        }
    }

    /// mlx-vlm's `TextConfig` defaults for what `text_config` leaves out.
    fn text_defaults(self, text: &Map<String, Value>) -> Value {
        let common = json!({
            "rope_theta": 1_000_000.0,
            "num_hidden_layers": 32,
            "rope_traditional": false,
            "max_position_embeddings": 4096,
        });
        let mut d = common.as_object().expect("an object").clone();
        if self == Family::SmolVlm {
            let hidden = text
                .get("hidden_size")
                .and_then(Value::as_i64)
                .unwrap_or(4096);
            let heads = match text.get("head_dim").and_then(Value::as_i64) {
                Some(h) if h > 0 => hidden / h,
                _ => 32,
            };
            for (k, v) in [
                ("hidden_size", json!(4096)),
                ("intermediate_size", json!(11008)),
                ("num_attention_heads", json!(heads)),
                ("rms_norm_eps", json!(1e-5)),
                ("vocab_size", json!(49152)),
            ] {
                d.insert(k.into(), v);
            }
        }
        Value::Object(d)
    }
}

/// mlx-vlm's idefics3 `TextConfig` as the Llama config `models/llama.rs` reads: its defaults
/// where `text_config` leaves keys out (RoPE base 1e6), and what its language model ignores
/// removed: `head_dim` (always `hidden / heads`), `rope_scaling`, sliding windows, biases. The
/// head is never tied: mlx-vlm always builds `lm_head` and loads it from the checkpoint.
fn text_config(family: Family, mut text: Value) -> Result<Value, EngineError> {
    let Some(obj) = text.as_object_mut() else {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            "config.json: `text_config` must be an object",
        ));
    };
    let defaults = family.text_defaults(obj);
    for (k, v) in defaults.as_object().expect("an object") {
        if obj.get(k).is_none_or(Value::is_null) {
            obj.insert(k.clone(), v.clone());
        }
    }
    if obj.get("num_key_value_heads").is_none_or(Value::is_null) {
        let heads = obj["num_attention_heads"].clone();
        obj.insert("num_key_value_heads".into(), heads);
    }
    for key in [
        "head_dim",
        "rope_scaling",
        "layer_types",
        "sliding_window",
        "attention_bias",
        "mlp_bias",
    ] {
        obj.remove(key);
    }
    obj.insert("tie_word_embeddings".into(), json!(false));
    obj.insert("model_type".into(), json!("llama"));
    Ok(text)
}

pub struct Idefics3Vision {
    tower: SiglipTower,
    scale_factor: i32,
    /// `connector.modality_projection.proj`, no bias.
    projection: Linear,
    image_token_id: u32,
    /// `<image>` tokens per tile.
    image_seq_len: usize,
    processor: images::processors::Idefics3ImageProcessor,
}

/// Splits an Idefics3 / SmolVLM checkpoint: the vision side built here, the language model's
/// tensors left in `weights` under mlx-lm's Llama names; returns that model's config.
pub fn load(
    family: Family,
    dir: &Path,
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(Idefics3Vision, Value), EngineError> {
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    let args: Args = parse_args(config)?;
    let text = text_config(family, args.text_config)?;
    let mut vision = match args.vision_config {
        Value::Object(v) => v,
        Value::Null => Map::new(),
        _ => {
            return Err(invalid(
                "config.json: `vision_config` must be an object".into(),
            ))
        }
    };
    family.vision_defaults(&mut vision);
    let vision: SiglipConfig = serde_json::from_value(Value::Object(vision))
        .map_err(|e| invalid(format!("config.json: vision_config: {e}")))?;
    let images::processors::Processor::Idefics3(processor) = processor else {
        return Err(invalid(format!(
            "{}: not an Idefics3/SmolVLM image processor",
            dir.display()
        )));
    };

    // Each tile is a grid of patches the pixel shuffle must divide, into as many features as
    // the processor writes `<image>` tokens per tile (mlx-vlm fails at the first image else).
    let (tile, patch, s) = (
        processor.tile as i32,
        vision.patch_size.max(1),
        args.scale_factor,
    );
    let grid = tile / patch;
    if grid == 0 || tile % patch != 0 || s < 1 || grid % s != 0 {
        return Err(invalid(format!(
            "the image processor's {tile} px tiles (max_image_size) make no patch grid of patch \
             {patch} that scale_factor {s} divides"
        )));
    }
    let proc: ProcessorArgs = super::shared::processor_args(dir)?;
    let image_seq_len = proc.image_seq_len.unwrap_or(169);
    let features = (grid * grid / (s * s)) as usize;
    if features != image_seq_len {
        return Err(invalid(format!(
            "{} expands each tile to {image_seq_len} image tokens (image_seq_len), but the model \
             makes {features} features per {tile} px tile (patch {patch}, scale_factor {s})",
            dir.join("processor_config.json").display(),
        )));
    }

    let (mut tower_weights, mut connector) = split_parts(weights)?;
    let mut tower = SiglipTower::load(&vision, &mut tower_weights)?;
    tower
        .select_positions(&position_ids(grid, vision.patches_per_side())?)
        .map_err(|e| invalid(format!("vision position embeddings: {e}")))?;
    let projection = connector.linear("modality_projection.proj")?;
    for (part, rest) in [("vision model", &tower_weights), ("connector", &connector)] {
        if let Some(name) = rest.names().next() {
            return Err(invalid(format!("unexpected tensor `{name}` in the {part}")));
        }
    }
    Ok((
        Idefics3Vision {
            tower,
            scale_factor: s,
            projection,
            image_token_id: args.image_token_index.unwrap_or(args.image_token_id),
            image_seq_len,
            processor,
        },
        text,
    ))
}

/// Splits the checkpoint's tensors: returns the vision model's and the connector's, and leaves
/// the language model's in `weights` under mlx-lm's names (`model.*`, `lm_head.*`).
/// transformers (4 and 5) saves `model.vision_model.*`, `model.connector.*`,
/// `model.text_model.*`, `lm_head.*`; mlx-vlm and mlx-community `vision_model.*`,
/// `connector.*`, `language_model.*` (the head as `language_model.lm_head.*`).
fn split_parts(weights: &mut Weights) -> Result<(Weights, Weights), EngineError> {
    weights.rename_prefix("model.vision_model.", "vision_model.");
    weights.rename_prefix("model.connector.", "connector.");
    weights.rename_prefix("model.text_model.", "language_model.");
    weights.rename_prefix("lm_head.", "language_model.lm_head.");
    let tower = weights.split_off("vision_model.");
    let connector = weights.split_off("connector.");
    let mut language = weights.split_off("language_model.");
    for part in ["embed_tokens.", "layers.", "norm."] {
        language.rename_prefix(part, &format!("model.{part}"));
    }
    super::shared::keep_language(weights, language, "Idefics3/SmolVLM")?;
    Ok((tower, connector))
}

/// The position ids mlx-vlm's Idefics3 `VisionEmbeddings` gives the patches of a full
/// `grid` x `grid` tile with a position table of `side` x `side`: each row's (column's)
/// fraction `i / grid`, clipped below 1, counted against the boundaries `arange(1/side, 1,
/// 1/side)` in float32. Float rounding makes these differ from `0..grid²` for most sides (side
/// 32: some rows repeat); computed with MLX's own ops so they match.
fn position_ids(grid: i32, side: i32) -> layers::Result<Array> {
    let step = 1.0 / f64::from(side);
    let boundaries = Array::arange::<f64, f32>(step, 1.0, step)?.expand_dims(0)?;
    let fractions =
        Array::arange::<i32, f32>(None, grid, None)?.divide(Array::from_f32(grid as f32))?;
    let top = Array::from_f32((1.0f64 - 1e-6) as f32);
    let fractions = ops::clip(&fractions, (Array::from_f32(0.0), top))?.expand_dims(1)?;
    let buckets = fractions
        .ge(&boundaries)?
        .sum_axes(&[1], None)?
        .as_dtype(Dtype::Int32)?;
    let rows = buckets.expand_dims(1)?.multiply(Array::from_int(side))?;
    rows.add(buckets.expand_dims(0)?)?.reshape(&[-1])
}

impl Idefics3Vision {
    /// mlx-vlm's connector: `(tiles, patches, d)` -> `(tiles, patches / s², d s²)` by pixel
    /// shuffle, then the projection.
    fn connect(&self, x: &Array) -> layers::Result<Array> {
        let (b, n, d) = (x.dim(0), x.dim(1), x.dim(2));
        let s = self.scale_factor;
        let side = (n as f64).sqrt() as i32;
        let x = x
            .reshape(&[b, side, side / s, d * s])?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, side / s, side / s, d * s * s])?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, n / (s * s), d * s * s])?;
        self.projection.forward(&x)
    }

    /// The processor's text for one image of `rows` x `cols` tiles (0 x 0: not split).
    fn image_text(&self, rows: usize, cols: usize) -> String {
        let tile = IMAGE.repeat(self.image_seq_len);
        let mut out = String::new();
        for r in 1..=rows {
            for c in 1..=cols {
                out += &format!("{FAKE}<row_{r}_col_{c}>{tile}");
            }
            out.push('\n');
        }
        if rows > 0 || cols > 0 {
            out.push('\n');
        }
        out + &format!("{FAKE}{GLOBAL}{tile}{FAKE}")
    }
}

impl VisionModel for Idefics3Vision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        if images.is_empty() {
            // mlx-vlm tokenizes a text-only prompt as it is.
            return Ok(PromptTokens {
                text: text.to_owned(),
                tokens_per_image: Vec::new(),
            });
        }
        super::shared::check_placeholders(text, IMAGE, images.len())?;
        let pieces: Vec<&str> = text.split(IMAGE).collect();
        let mut out = pieces[0].to_owned();
        let mut tokens_per_image = Vec::with_capacity(images.len());
        for (image, rest) in images.iter().zip(&pieces[1..]) {
            let (rows, cols) = self.processor.grid(image.height, image.width);
            out += &self.image_text(rows, cols);
            out += rest;
            tokens_per_image.push(self.image_seq_len * (rows * cols + 1));
        }
        Ok(PromptTokens {
            text: out,
            tokens_per_image,
        })
    }

    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError> {
        let processor = images::processors::Processor::Idefics3(self.processor.clone());
        super::shared::pixel_values(&processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, _dtype: Dtype) -> layers::Result<Array> {
        // `(1, tiles, C, H, W)` -> channels-last tiles. mlx-vlm embeds the float32 pixels, casts
        // the embeddings to the tower's dtype, and casts its output back to float32 (the
        // pixels' dtype) for the connector.
        let p = &inputs.pixel_values;
        let (c, h, w) = (p.dim(-3), p.dim(-2), p.dim(-1));
        let pixels = p.reshape(&[-1, c, h, w])?.transpose_axes(&[0, 2, 3, 1])?;
        let embedded = self.tower.embed(&pixels)?.as_dtype(self.tower.dtype())?;
        let hidden = self.tower.encode(embedded)?.as_dtype(pixels.dtype())?;
        let features = self.connect(&hidden)?;
        let d = features.dim(-1);
        features.reshape(&[-1, d])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_ids_are_mlx_vlms_buckets() {
        // mlx-vlm 0.7.0 on MLX 0.32.2: side 6 repeats the last row, side 7 the third.
        let ids = |n: i32| position_ids(n, n).unwrap().as_slice::<i32>().to_vec();
        let six = ids(6);
        assert_eq!(&six[..6], &[0, 1, 2, 3, 4, 4]);
        assert_eq!(&six[30..], &[24, 25, 26, 27, 28, 28]);
        assert_eq!(&ids(7)[..7], &[0, 1, 2, 2, 4, 5, 6]);
        assert_eq!(ids(8), (0..64).collect::<Vec<i32>>());
    }

    #[test]
    fn transformers_and_mlx_vlm_names_split_alike() {
        let names = |layout: &[&str]| {
            let t = layout
                .iter()
                .map(|n| (n.to_string(), Array::from_f32(0.0)))
                .collect();
            let mut w = Weights::from_tensors(t, &json!({}));
            let (tower, connector) = split_parts(&mut w).unwrap();
            let sorted = |w: &Weights| {
                let mut v: Vec<String> = w.names().cloned().collect();
                v.sort();
                v
            };
            (sorted(&tower), sorted(&connector), sorted(&w))
        };
        let hf = names(&[
            "model.vision_model.post_layernorm.weight",
            "model.connector.modality_projection.proj.weight",
            "model.text_model.embed_tokens.weight",
            "model.text_model.layers.0.mlp.up_proj.weight",
            "model.text_model.norm.weight",
            "lm_head.weight",
        ]);
        let mlx = names(&[
            "vision_model.post_layernorm.weight",
            "connector.modality_projection.proj.weight",
            "language_model.embed_tokens.weight",
            "language_model.layers.0.mlp.up_proj.weight",
            "language_model.norm.weight",
            "language_model.lm_head.weight",
        ]);
        assert_eq!(hf, mlx);
        let language = [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.norm.weight",
        ];
        assert_eq!(hf.2, language);
        assert_eq!(hf.1, ["modality_projection.proj.weight"]);
    }

    #[test]
    fn the_text_config_is_mlx_vlms() {
        let text = text_config(
            Family::Idefics3,
            json!({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32,
                   "rope_scaling": {"type": "linear", "factor": 2.0}, "tie_word_embeddings": true}),
        )
        .unwrap();
        assert_eq!(text["rope_theta"], json!(1_000_000.0));
        assert_eq!(text["num_key_value_heads"], json!(4));
        assert_eq!(text["tie_word_embeddings"], json!(false));
        assert_eq!(text["model_type"], json!("llama"));
        assert!(text.get("head_dim").is_none() && text.get("rope_scaling").is_none());
        let smol = text_config(Family::SmolVlm, json!({"hidden_size": 576, "head_dim": 64}));
        assert_eq!(smol.unwrap()["num_attention_heads"], json!(9));
    }
}
