//! Mistral 3 with images (`Mistral3ForConditionalGeneration`: Mistral Small 3.x), as mlx-vlm
//! 0.7.0's `mistral3` computes it: the Pixtral tower (`pixtral.rs`), the hidden state of
//! `vision_feature_layer` (-1: the last layer's), then the projector: an RMS norm (the text
//! model's eps), the patch merger (each image's patch grid cut into `spatial_merge_size`-square
//! blocks, a block's features concatenated channel-major, `merging_layer`), `linear_1`, exact
//! GELU, `linear_2`. The prompt's `[IMG]` becomes, per image, rows of `[IMG]` (one per merged
//! block), the rows separated by `[IMG_BREAK]` and ended by `[IMG_END]` (the processor's
//! expansion, on text); the features replace the `[IMG]` embeddings. The language model is the
//! text model `models/mistral3.rs` names (a Llama, or Ministral 3).

use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{self, gelu, Linear, RmsNorm},
    models::{self, parse_args},
    vision::{
        model::PromptTokens,
        model::VisionModel,
        pixtral::{PixtralConfig, PixtralTower},
        shared::ImageInputs,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    vision_config: PixtralConfig,
    image_token_index: Option<u32>,
    image_token_id: Option<u32>,
    #[serde(default = "default_merge")]
    spatial_merge_size: i32,
    #[serde(default = "default_feature_layer")]
    vision_feature_layer: i64,
}

fn default_merge() -> i32 {
    2
}
fn default_feature_layer() -> i64 {
    -1
}

/// The names `processor_config.json` gives the image tokens (mlx-vlm's defaults).
#[derive(Debug, Deserialize)]
#[serde(default)]
struct ProcessorArgs {
    image_token: String,
    image_break_token: String,
    image_end_token: String,
}

impl Default for ProcessorArgs {
    fn default() -> Self {
        Self {
            image_token: "[IMG]".into(),
            image_break_token: "[IMG_BREAK]".into(),
            image_end_token: "[IMG_END]".into(),
        }
    }
}

pub struct Mistral3Vision {
    tower: PixtralTower,
    /// Index into the tower's hidden states (`ln_pre`'s output first).
    feature_layer: usize,
    norm: RmsNorm,
    merging_layer: Linear,
    linear_1: Linear,
    linear_2: Linear,
    merge: i32,
    tokens: ProcessorArgs,
    image_token_id: u32,
    processor: images::processors::PixtralImageProcessor,
}

/// Splits a Mistral 3 checkpoint: the vision side built here, the language model's tensors
/// left in `weights`; returns that model's config.
pub fn load(
    dir: &std::path::Path,
    config: &Value,
    weights: &mut Weights,
    processor: images::processors::Processor,
) -> Result<(Mistral3Vision, Value), EngineError> {
    let args: Args = parse_args(config)?;
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    let text = models::mistral3_text_config(config)?;
    let images::processors::Processor::Pixtral(processor) = processor else {
        return Err(invalid(
            "mistral3: its image processor is not Pixtral's".into(),
        ));
    };
    // transformers 5 and older checkpoints name the tower without `vision_model`.
    for part in ["patch_conv", "ln_pre", "transformer"] {
        weights.rename_prefix(
            &format!("model.vision_tower.{part}"),
            &format!("vision_tower.vision_model.{part}"),
        );
        weights.rename_prefix(
            &format!("vision_tower.{part}"),
            &format!("vision_tower.vision_model.{part}"),
        );
    }
    let (mut tower_weights, mut projector) = super::shared::split_parts(weights, "Mistral 3")?;
    let vision = &args.vision_config;
    let tower = PixtralTower::load(vision, &mut tower_weights)?;
    let states = vision.num_hidden_layers as i64 + 1;
    let layer = args.vision_feature_layer;
    let index = if layer < 0 { states + layer } else { layer };
    if !(0..states).contains(&index) {
        return Err(invalid(format!(
            "config.json: vision_feature_layer {layer} is outside the tower's {states} hidden \
             states (only one layer is supported)"
        )));
    }
    let eps = text["rms_norm_eps"].as_f64().unwrap_or(1e-5) as f32;
    let norm = projector.rms_norm("norm", eps)?;
    let merging_layer = projector.linear("patch_merger.merging_layer")?;
    let linear_1 = projector.linear("linear_1")?;
    let linear_2 = projector.linear("linear_2")?;
    for (part, rest) in [("vision tower", &tower_weights), ("projector", &projector)] {
        if let Some(name) = rest.names().next() {
            return Err(invalid(format!("unexpected tensor `{name}` in the {part}")));
        }
    }
    let merge = args.spatial_merge_size.max(1);
    if processor.patch != (vision.patch_size * merge) as u32 {
        return Err(invalid(format!(
            "the image processor fits images to patches of {} px, but the tower's patches of {} \
             px merged {merge} by {merge} make {}",
            processor.patch,
            vision.patch_size,
            vision.patch_size * merge
        )));
    }
    let image_token_id = args
        .image_token_index
        .or(args.image_token_id)
        .ok_or_else(|| invalid("config.json: mistral3 needs `image_token_index`".into()))?;
    Ok((
        Mistral3Vision {
            tower,
            feature_layer: index as usize,
            norm,
            merging_layer,
            linear_1,
            linear_2,
            merge,
            tokens: super::shared::processor_args(dir)?,
            image_token_id,
            processor,
        },
        text,
    ))
}

impl Mistral3Vision {
    /// mlx-vlm's `Mistral3PatchMerger`: per image, its `(h * w, d)` patch features as an `(h, w)`
    /// grid cut into `merge`-square blocks, each block's features `[c * merge^2 + i * merge + j]`
    /// (channel-major, as `unfold` orders them), all images' blocks in order, then
    /// `merging_layer`.
    fn merge_patches(&self, x: &Array, sizes: &[[usize; 2]], patch: i32) -> layers::Result<Array> {
        let (d, m) = (x.dim(-1), self.merge);
        let mut start = 0;
        let mut merged = Vec::with_capacity(sizes.len());
        for [h, w] in sizes {
            let (gh, gw) = (*h as i32 / patch, *w as i32 / patch);
            let rows = ops_slice(x, start, gh * gw)?;
            start += gh * gw;
            let blocks = rows
                .reshape(&[gh / m, m, gw / m, m, d])?
                .transpose_axes(&[0, 2, 4, 1, 3])?
                .reshape(&[(gh / m) * (gw / m), d * m * m])?;
            merged.push(blocks);
        }
        let merged = mlx_rs::ops::concatenate(&merged, 0)?;
        self.merging_layer.forward(&merged)
    }
}

/// Rows `start..start + n` of `(N, d)`.
fn ops_slice(x: &Array, start: i32, n: i32) -> layers::Result<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    Ok(x.index(start..start + n))
}

impl VisionModel for Mistral3Vision {
    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError> {
        let t = &self.tokens;
        super::shared::check_placeholders(text, &t.image_token, images.len())?;
        let mut parts = text.split(t.image_token.as_str());
        let mut out = parts.next().unwrap_or_default().to_owned();
        let mut tokens_per_image = Vec::with_capacity(images.len());
        for (image, rest) in images.iter().zip(parts) {
            let (rows, cols) =
                self.processor
                    .token_grid(image)
                    .map_err(|e| EngineError::InvalidParams {
                        field: "messages".into(),
                        reason: e.to_string(),
                    })?;
            let row = t.image_token.repeat(cols);
            out.push_str(&vec![row; rows].join(&t.image_break_token));
            out.push_str(&t.image_end_token);
            out.push_str(rest);
            tokens_per_image.push(rows * cols);
        }
        Ok(PromptTokens {
            text: out,
            tokens_per_image,
        })
    }

    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError> {
        let processor = images::processors::Processor::Pixtral(self.processor.clone());
        super::shared::pixel_values(&processor, images)
    }

    fn encode(&self, inputs: &ImageInputs, _dtype: Dtype) -> layers::Result<Array> {
        let pixels = inputs.pixel_values.transpose_axes(&[0, 2, 3, 1])?;
        let states = self.tower.hidden_states(&pixels, &inputs.image_sizes)?;
        let x = states[self.feature_layer].squeeze_axes(&[0])?;
        let x = self.norm.forward(&x)?;
        let patch = self.processor.patch as i32 / self.merge;
        let x = self.merge_patches(&x, &inputs.image_sizes, patch)?;
        let x = gelu(&self.linear_1.forward(&x)?)?;
        self.linear_2.forward(&x)
    }
}
