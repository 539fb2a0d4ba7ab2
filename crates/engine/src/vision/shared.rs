//! What the vision families share: splitting a checkpoint, processor settings, placeholders,
//! pixel values, writing image features over the image tokens' embeddings.

use std::path::Path;

use mlx_rs::{ops, Array};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers,
    layers::weights::Weights,
};

/// A batch of images as the family's encoder takes them.
pub struct ImageInputs {
    /// `(images, channels, height, width)`, float32, as the Hugging Face processor makes it.
    pub pixel_values: Array,
    /// Qwen-VL: `[t, h, w]` in patches, per image.
    pub grid_thw: Vec<[usize; 3]>,
    /// Mistral 3: each image's `[height, width]` in pixels before the batch's padding.
    pub image_sizes: Vec<[usize; 2]>,
}

/// Splits a `*ForConditionalGeneration` checkpoint: returns the vision tower's tensors (under
/// `vision_tower.vision_model.`) and the projector's (`multi_modal_projector.`), and leaves the
/// language model's in `weights`, under mlx-lm's names (`model.*`, `lm_head.*`). transformers 5
/// saves `model.language_model.*`, `model.vision_tower.*`, ...; mlx-vlm, mlx-community and
/// older Hugging Face checkpoints have the older names: both are read. A tensor of no part is an
/// error naming `family`.
pub(crate) fn split_parts(
    weights: &mut Weights,
    family: &str,
) -> Result<(Weights, Weights), EngineError> {
    weights.rename_prefix("model.language_model.", "language_model.model.");
    weights.rename_prefix("model.vision_tower.", "vision_tower.");
    weights.rename_prefix("model.multi_modal_projector.", "multi_modal_projector.");
    weights.rename_prefix("lm_head.", "language_model.lm_head.");
    let tower = weights.split_off("vision_tower.vision_model.");
    let projector = weights.split_off("multi_modal_projector.");
    let language = weights.split_off("language_model.");
    keep_language(weights, language, family)?;
    Ok((tower, projector))
}

/// Ends a family's split of its checkpoint: a tensor that went to no part is an error naming
/// `family`; otherwise `weights` becomes `language`, the language model's tensors.
pub(crate) fn keep_language(
    weights: &mut Weights,
    language: Weights,
    family: &str,
) -> Result<(), EngineError> {
    if let Some(name) = weights.names().next() {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("tensor `{name}` belongs to no part of the {family} vision model"),
        ));
    }
    *weights = language;
    Ok(())
}

/// The model's Hugging Face image processor, from its processor files.
pub(crate) fn image_processor(
    dir: &Path,
    model_type: &str,
) -> Result<images::processors::Processor, EngineError> {
    images::processors::Processor::from_model_dir(dir, model_type).map_err(|e| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("image processor of {}: {e}", dir.display()),
        )
    })
}

/// Checks that the rendered `text` has one `placeholder` per image, as the chat template writes
/// them; a count that differs (a placeholder typed in the text) is the request's error.
pub(crate) fn check_placeholders(
    text: &str,
    placeholder: &str,
    images: usize,
) -> Result<(), EngineError> {
    let found = text.matches(placeholder).count();
    match found == images {
        true => Ok(()),
        false => Err(EngineError::InvalidParams {
            field: "messages".into(),
            reason: format!(
                "the prompt has {found} `{placeholder}` placeholders for {images} images (the \
                 chat template writes one per image part; do not write `{placeholder}` in text)"
            ),
        }),
    }
}

/// The settings a family reads from `processor_config.json` (the defaults when there is none).
pub(crate) fn processor_args<T: serde::de::DeserializeOwned + Default>(
    dir: &Path,
) -> Result<T, EngineError> {
    let path = dir.join("processor_config.json");
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    match images::processors::hf::read_json(&path) {
        Ok(Some(v)) => {
            serde_json::from_value(v).map_err(|e| invalid(format!("{}: {e}", path.display())))
        }
        Ok(None) => Ok(T::default()),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// The pixel values `processor` makes of `images`, as an MLX array.
pub(crate) fn pixel_values(
    processor: &images::processors::Processor,
    images: &[images::RgbImage],
) -> Result<ImageInputs, EngineError> {
    let processed = processor
        .preprocess(images)
        .map_err(|e| EngineError::InvalidParams {
            field: "messages".into(),
            reason: format!("preprocessing the images: {e}"),
        })?;
    let p = processed.pixel_values;
    let shape: Vec<i32> = p.shape.iter().map(|&d| d as i32).collect();
    Ok(ImageInputs {
        pixel_values: Array::from_slice(&p.data, &shape),
        grid_thw: processed.image_grid_thw,
        image_sizes: processed.image_sizes,
    })
}

/// `embeds` `(1, L, D)` with the rows of `image_id` tokens replaced, in order, by the rows of
/// `features` `(F, D)` (mlx-vlm's `masked_scatter`), as a gather over both.
pub(crate) fn scatter_rows(
    ids: &[u32],
    image_id: u32,
    embeds: Array,
    features: &Array,
) -> layers::Result<Array> {
    let (l, d) = (ids.len() as i32, embeds.dim(-1));
    let mut next = l;
    let rows: Vec<i32> = (0..l)
        .map(|i| match ids[i as usize] == image_id {
            true => {
                next += 1;
                next - 1
            }
            false => i,
        })
        .collect();
    let found = next - l;
    if found != features.dim(0) {
        return Err(mlx_rs::error::Exception::custom(format!(
            "{found} image tokens for {} image feature rows",
            features.dim(0)
        )));
    }
    let table = ops::concatenate(&[embeds.reshape(&[l, d])?, features.clone()], 0)?;
    table
        .take_axis(Array::from_slice(&rows, &[l]), 0)?
        .reshape(&[1, l, d])
}
