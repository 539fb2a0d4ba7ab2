//! The vision side of a vision-language model, as the runtime sees it.

use mlx_rs::{Array, Dtype};

use super::shared::{scatter_rows, ImageInputs};
use crate::{error::EngineError, layers, layers::mrope::MropePositions};

/// A rendered prompt with its image placeholders expanded.
pub struct PromptTokens {
    pub text: String,
    /// Image tokens per image, in prompt order.
    pub tokens_per_image: Vec<usize>,
}

/// The vision side of a vision-language model.
pub trait VisionModel {
    /// The token id whose embeddings image features replace.
    fn image_token_id(&self) -> u32;
    /// Expands the placeholders the chat template wrote for `images` (one each, in order) into
    /// the tokens the model expects (the processor's step, on text, so tokenization matches
    /// it; some families' counts depend on the image's size).
    fn expand_prompt(
        &self,
        text: &str,
        images: &[images::RgbImage],
    ) -> Result<PromptTokens, EngineError>;
    /// The rotary positions of the whole prompt `ids` with `images`, for a family whose
    /// language model takes them explicitly (M-RoPE); `None`: positions are token indices.
    fn positions(
        &self,
        _ids: &[u32],
        _images: &[images::RgbImage],
    ) -> Result<Option<MropePositions>, EngineError> {
        Ok(None)
    }
    /// The images' pixel values, as the family's Hugging Face processor computes them.
    fn preprocess(&self, images: &[images::RgbImage]) -> Result<ImageInputs, EngineError>;
    /// Feature rows `(image tokens, text hidden)` for `inputs`, computed in `dtype` (the
    /// language model's embedding dtype, as mlx-vlm casts the pixels).
    fn encode(&self, inputs: &ImageInputs, dtype: Dtype) -> layers::Result<Array>;
    /// [`VisionModel::encode`]'s features and, for Qwen3-VL (deepstack), per first language
    /// layer the rows `(image tokens, hidden)` added to that layer's output at the image
    /// tokens. Other families: none.
    fn encode_with_deepstack(
        &self,
        inputs: &ImageInputs,
        dtype: Dtype,
    ) -> layers::Result<(Array, Vec<Array>)> {
        Ok((self.encode(inputs, dtype)?, Vec::new()))
    }
    /// The language model's input embeddings `(1, L, hidden)` for `ids`, with `features` (one
    /// row per image token among `ids`, in order) in the image tokens' places. By default as
    /// mlx-vlm's LLaVA and Idefics3 do: the features cast to the embeddings' dtype, written over
    /// the image rows, unscaled.
    fn merge(&self, ids: &[u32], embeds: Array, features: &Array) -> layers::Result<Array> {
        let features = features.as_dtype(embeds.dtype())?;
        scatter_rows(ids, self.image_token_id(), embeds, &features)
    }
}
