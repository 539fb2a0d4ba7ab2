//! A request's prompt as the model takes it: token ids and, for a vision-language model, the
//! images among them (decoded) with a prompt-cache key that tells images apart.

use std::hash::{Hash, Hasher};

use mlx_rs::{ops, ops::indexing::IndexOp, transforms, Array};
use serde_json::{json, Value};
use text::{Message, MessageContent, ModelTokenizer};

use crate::{
    layers::mrope::MropePositions,
    models::LanguageModel,
    runtime::image_features::{Encoded, ImageFeatures},
    runtime::request::Prompt,
    vision::VisionModel,
    EngineError,
};

pub(crate) struct PromptInputs {
    pub ids: Vec<u32>,
    /// What the prompt cache compares: `ids`, with each image token replaced by a key of its
    /// image's pixels and its place in the image, so a different image never matches.
    pub cache_keys: Vec<u32>,
    pub images: Option<PromptImages>,
    /// The whole prompt's rotary positions, for a model that takes them explicitly (M-RoPE).
    pub positions: Option<MropePositions>,
}

/// The images of a prompt, in prompt order.
pub(crate) struct PromptImages {
    /// Decoded; preprocessed only when their tokens are prefilled (not when the prompt cache
    /// holds them already, as in a chat's next turn about the same image).
    pub decoded: Vec<images::RgbImage>,
    /// Image tokens per image.
    pub tokens_per_image: Vec<usize>,
    /// A digest of each image's pixels (what tells images apart).
    pub digests: Vec<u64>,
}

/// Cache keys of image tokens have the top bit set: no vocabulary reaches 2^31 ids.
const IMAGE_KEY: u32 = 1 << 31;

/// An image part of a message: its source and the request field that holds it.
struct ImagePart {
    field: String,
    source: String,
}

/// The prompt of `prompt` for this model: rendered, images taken out of the messages and
/// decoded, placeholders expanded, tokenized.
pub(crate) fn prompt_inputs(
    tokenizer: &ModelTokenizer,
    vision: Option<&dyn VisionModel>,
    prompt: &Prompt,
) -> Result<PromptInputs, EngineError> {
    let text_only = |ids: Vec<u32>| PromptInputs {
        cache_keys: ids.clone(),
        ids,
        images: None,
        positions: None,
    };
    let (messages, options) = match prompt {
        Prompt::Tokens(ids) => return Ok(text_only(ids.clone())),
        Prompt::Text(text) => return Ok(text_only(encode(tokenizer, text, true)?)),
        Prompt::Chat { messages, options } => (messages, options),
    };
    let (messages, parts) = take_images(messages, vision.is_some());
    let Some(vision) = vision else {
        return match parts.first() {
            Some(part) => Err(EngineError::InvalidParams {
                field: part.field.clone(),
                reason: "this model takes no images (`info.is_vision` is false: it is not a \
                         vision model, or a multimodal one whose tower this worker does not \
                         run); send text only or load a vision model"
                    .into(),
            }),
            None => Ok(text_only(render(tokenizer, &messages, options, |t| {
                Ok(t.to_owned())
            })?)),
        };
    };
    let decoded = parts.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
    let mut tokens_per_image = Vec::new();
    let ids = render(tokenizer, &messages, options, |text| {
        let expanded = vision.expand_prompt(text, &decoded)?;
        tokens_per_image = expanded.tokens_per_image;
        Ok(expanded.text)
    })?;
    if decoded.is_empty() {
        return Ok(text_only(ids));
    }
    let digests: Vec<u64> = decoded.iter().map(digest).collect();
    let cache_keys = image_keys(&ids, vision.image_token_id(), &digests, &tokens_per_image)?;
    Ok(PromptInputs {
        positions: vision.positions(&ids, &decoded)?,
        ids,
        cache_keys,
        images: Some(PromptImages {
            decoded,
            tokens_per_image,
            digests,
        }),
    })
}

fn encode(tokenizer: &ModelTokenizer, text: &str, special: bool) -> Result<Vec<u32>, EngineError> {
    tokenizer
        .encode(text, special)
        .map_err(|e| EngineError::Template(e.to_string()))
}

/// The chat template's text, through `expand`, tokenized without added special tokens (the
/// template writes them).
fn render(
    tokenizer: &ModelTokenizer,
    messages: &[Message],
    options: &text::RenderOptions,
    expand: impl FnOnce(&str) -> Result<String, EngineError>,
) -> Result<Vec<u32>, EngineError> {
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| EngineError::Template(text::TokenizerError::NoChatTemplate.to_string()))?;
    let text = template
        .render(messages, options)
        .map_err(|e| EngineError::Template(e.to_string()))?;
    encode(tokenizer, &expand(&text)?, false)
}

/// The messages as the template sees them, each image part reduced to `{"type": "image"}`, and
/// the image parts in order. For a vision model, plain string content becomes one text part
/// (as mlx-vlm gives it), so templates that loop over parts render it.
fn take_images(messages: &[Message], vision: bool) -> (Vec<Message>, Vec<ImagePart>) {
    let mut parts = Vec::new();
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                Some(MessageContent::Parts(list)) => {
                    let list = list
                        .iter()
                        .enumerate()
                        .map(|(j, part)| match image_source(part) {
                            Some(source) => {
                                let field = part["field"].as_str().map_or_else(
                                    || format!("messages[{i}].content[{j}]"),
                                    str::to_owned,
                                );
                                parts.push(ImagePart { field, source });
                                json!({"type": "image"})
                            }
                            None => part.clone(),
                        });
                    Some(MessageContent::Parts(list.collect()))
                }
                Some(MessageContent::Text(s)) if vision => Some(MessageContent::Parts(vec![
                    json!({"type": "text", "text": s}),
                ])),
                other => other.clone(),
            };
            Message {
                content,
                ..m.clone()
            }
        })
        .collect();
    (messages, parts)
}

/// The image a content part carries: `{"type": "image", "image": src}` or OpenAI's
/// `{"type": "image_url", "image_url": {"url": src}}`.
fn image_source(part: &Value) -> Option<String> {
    let source = match part["type"].as_str()? {
        "image" => &part["image"],
        "image_url" => match &part["image_url"] {
            Value::Object(o) => o.get("url")?,
            other => other,
        },
        _ => return None,
    };
    Some(source.as_str().unwrap_or_default().to_owned())
}

fn decode(part: &ImagePart) -> Result<images::RgbImage, EngineError> {
    images::load(&part.source, &images::DecodeLimits::default()).map_err(|e| {
        EngineError::InvalidParams {
            field: part.field.clone(),
            reason: e.to_string(),
        }
    })
}

/// `ids` with the k-th token of image i replaced by a key of (image i's pixels, k).
fn image_keys(
    ids: &[u32],
    image_id: u32,
    digests: &[u64],
    tokens_per_image: &[usize],
) -> Result<Vec<u32>, EngineError> {
    let mut owners = tokens_per_image
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| (0..n).map(move |k| (i, k)));
    let keys = ids
        .iter()
        .map(|&id| match id == image_id {
            true => owners.next().map(|(i, k)| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (digests[i], k).hash(&mut h);
                IMAGE_KEY | (h.finish() as u32 & !IMAGE_KEY)
            }),
            false => Some(id),
        })
        .collect::<Option<Vec<u32>>>();
    match (keys, owners.next()) {
        (Some(keys), None) => Ok(keys),
        _ => Err(EngineError::InvalidParams {
            field: "messages".into(),
            reason: "the prompt's image tokens do not match its images (is an image token \
                     written in the text?)"
                .into(),
        }),
    }
}

fn digest(image: &images::RgbImage) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (image.width, image.height).hash(&mut h);
    image.pixels.hash(&mut h);
    h.finish()
}

/// A prompt's input embeddings, its images' features merged in.
pub(crate) struct PromptEmbeds {
    /// `(1, L, hidden)`.
    pub h: Array,
    /// Qwen3-VL's deepstack: per first language layer, `(1, L, hidden)` added to its output
    /// (the image's features at its tokens, zeros elsewhere). Empty for other families.
    pub deepstack: Vec<Array>,
}

impl PromptEmbeds {
    /// The first `n` positions, and the rest.
    pub fn split_at(self, n: i32) -> (Self, Self) {
        let head = |a: &Array| a.index((.., ..n));
        let tail = |a: &Array| a.index((.., n..));
        let first = PromptEmbeds {
            h: head(&self.h),
            deepstack: self.deepstack.iter().map(head).collect(),
        };
        let rest = PromptEmbeds {
            h: tail(&self.h),
            deepstack: self.deepstack.iter().map(tail).collect(),
        };
        (first, rest)
    }
}

/// The input embeddings `(1, L, D)` of `prompt.ids[reused..]` with the features of the image
/// tokens among them merged in (and their deepstack rows, for Qwen3-VL). Preprocesses and
/// encodes only the images those tokens belong to, unless `kept` holds what the encoder gave
/// for them (then the count of those images comes back with the embeddings; what it gives is
/// kept there when `persist`); evaluated, and the encoder's buffers released, before prefill
/// starts.
pub(crate) fn merged_embeddings(
    model: &dyn LanguageModel,
    vision: &dyn VisionModel,
    prompt: &PromptInputs,
    reused: usize,
    (kept, persist): (&mut ImageFeatures, bool),
) -> Result<(PromptEmbeds, usize), EngineError> {
    let images = prompt
        .images
        .as_ref()
        .expect("called for a prompt with images");
    let image_id = vision.image_token_id();
    let rest = &prompt.ids[reused..];
    let before = prompt.ids[..reused]
        .iter()
        .filter(|&&id| id == image_id)
        .count();
    // The first image with a token in `rest`, and how many of its tokens are already cached.
    let (mut first, mut skip) = (0, before);
    while first < images.tokens_per_image.len() && skip >= images.tokens_per_image[first] {
        skip -= images.tokens_per_image[first];
        first += 1;
    }
    let embeds = model.embed(&Array::from_slice(rest, &[1, rest.len() as i32]))?;
    let mut cached_images = 0;
    let (features, deepstack) = match first < images.tokens_per_image.len() {
        true => {
            let digests = &images.digests[first..];
            let encoded = match kept.get(digests) {
                Some(encoded) => {
                    cached_images = digests.len();
                    encoded
                }
                None => {
                    let inputs = vision.preprocess(&images.decoded[first..])?;
                    let (features, deepstack) =
                        vision.encode_with_deepstack(&inputs, embeds.dtype())?;
                    transforms::eval(std::iter::once(&features).chain(&deepstack))?;
                    let encoded = Encoded {
                        features,
                        deepstack,
                    };
                    if persist {
                        kept.keep(digests.to_vec(), encoded.clone());
                    }
                    encoded
                }
            };
            let skipped = |a: Array| a.index(skip as i32..);
            (
                skipped(encoded.features),
                encoded.deepstack.into_iter().map(skipped).collect(),
            )
        }
        false => {
            let none = Array::zeros::<f32>(&[0, embeds.dim(-1)])?.as_dtype(embeds.dtype())?;
            (none, Vec::new())
        }
    };
    // mlx-vlm adds the deepstack rows in the hidden states' dtype, at the image tokens.
    let zeros = ops::zeros_like(&embeds)?;
    let deepstack = deepstack
        .iter()
        .map(|rows| {
            let rows = rows.as_dtype(embeds.dtype())?;
            crate::vision::shared::scatter_rows(rest, image_id, zeros.clone(), &rows)
        })
        .collect::<Result<Vec<Array>, _>>()?;
    let merged = PromptEmbeds {
        h: vision.merge(rest, embeds, &features)?,
        deepstack,
    };
    transforms::eval(std::iter::once(&merged.h).chain(&merged.deepstack))?;
    drop(features);
    mlx_rs::memory::clear_cache()?;
    Ok((merged, cached_images))
}
