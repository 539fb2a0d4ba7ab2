//! The vision tower of mlx-vlm 0.7.0's `llava` (`llava/vision.py`, `ClipVisionModel`): a CLIP
//! ViT (`clip_vision_model`) or, with the same code, a SigLIP one (`siglip_vision_model`).
//!
//! CLIP: a bias-free strided convolution cuts the image into patches, a learned class embedding
//! goes in front, learned position embeddings (one per patch plus the class token) are added,
//! then a pre-LayerNorm (`pre_layrnorm`, MLX's default eps 1e-5), then pre-norm encoder layers
//! (LayerNorm with the config's eps, attention with biases, an MLP with quick GELU:
//! `x * sigmoid(1.702 x)`, MLX's `gelu_fast_approx`). SigLIP in this tower: a convolution with a
//! bias, no class token, no pre-LayerNorm, and the same quick-GELU MLP: mlx-vlm's llava does not
//! use `siglip.rs`'s tanh GELU here (transformers' SigLIP uses `gelu_pytorch_tanh`), so neither
//! does this file. The final LayerNorm is never part of LLaVA's features (they come from a
//! hidden state, `vision_feature_layer`), so it is not built.
//!
//! Nothing is cast: the pixels stay float32 and MLX promotes every op with the checkpoint's
//! (bfloat16 or float16) weights to float32, as in mlx-vlm.

use mlx_rs::{ops, Array};
use serde::Deserialize;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{quick_gelu, LayerNorm, Result},
    vision::siglip::EncoderLayer,
};

/// `vision_config` of config.json, with mlx-vlm's llava `VisionConfig` defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct ClipConfig {
    pub model_type: String,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_image_size")]
    pub image_size: i32,
    #[serde(default = "default_patch_size")]
    pub patch_size: i32,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f32,
}

fn default_layers() -> usize {
    24
}
fn default_hidden() -> i32 {
    1024
}
fn default_heads() -> i32 {
    16
}
fn default_image_size() -> i32 {
    336
}
fn default_patch_size() -> i32 {
    14
}
fn default_layer_norm_eps() -> f32 {
    1e-5
}

impl ClipConfig {
    /// A CLIP tower (class token, pre-LayerNorm); otherwise SigLIP.
    pub fn is_clip(&self) -> bool {
        self.model_type == "clip_vision_model"
    }

    /// Positions of the tower's hidden states: patches, plus the class token for CLIP.
    pub fn positions(&self) -> i32 {
        let side = self.image_size / self.patch_size;
        side * side + i32::from(self.is_clip())
    }
}

/// MLX's `nn.LayerNorm(hidden_size)` default, which mlx-vlm gives `pre_layrnorm`.
const PRE_LAYERNORM_EPS: f32 = 1e-5;

pub struct ClipTower {
    /// `(hidden, patch, patch, channels)`: MLX's convolution layout.
    patch_weight: Array,
    /// SigLIP only.
    patch_bias: Option<Array>,
    /// CLIP only: `(hidden,)`.
    class_embedding: Option<Array>,
    /// `(1, positions, hidden)`.
    position_embedding: Array,
    /// CLIP only.
    pre_layrnorm: Option<LayerNorm>,
    layers: Vec<EncoderLayer>,
    heads: i32,
    /// `head_dim^-0.5`, computed in f64 as Python does.
    scale: f32,
    patch_size: i32,
}

impl ClipTower {
    /// The tower from tensors named as under mlx-vlm's `vision_tower.vision_model.`. Only the
    /// first `layers` encoder layers are built (the hidden states LLaVA reads come no later);
    /// the rest, and the final LayerNorm, are dropped.
    pub fn load(
        config: &ClipConfig,
        w: &mut Weights,
        layers: usize,
    ) -> std::result::Result<Self, EngineError> {
        if !matches!(
            config.model_type.as_str(),
            "clip_vision_model" | "siglip_vision_model"
        ) {
            return Err(EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!(
                    "LLaVA vision tower `{}` is not supported; supported: clip_vision_model, \
                     siglip_vision_model",
                    config.model_type
                ),
            ));
        }
        let eps = config.layer_norm_eps;
        let mut built = Vec::with_capacity(layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layers.{i}");
            if i < layers {
                built.push(EncoderLayer::load(w, &p, eps)?);
                continue;
            }
            let rest: Vec<String> = w
                .names()
                .filter(|n| n.starts_with(&format!("{p}.")))
                .cloned()
                .collect();
            for name in rest {
                w.remove(&name);
            }
        }
        for suffix in ["weight", "bias"] {
            w.remove(&format!("post_layernorm.{suffix}"));
        }
        // transformers' buffer, which mlx-vlm's sanitize drops.
        w.remove("embeddings.position_ids");
        let clip = config.is_clip();
        let position_embedding = w.take("embeddings.position_embedding.weight")?;
        if position_embedding.dim(0) != config.positions() {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "the vision tower has {} position embeddings; {}x{} px images in {} px \
                     patches need {}",
                    position_embedding.dim(0),
                    config.image_size,
                    config.image_size,
                    config.patch_size,
                    config.positions()
                ),
            ));
        }
        let head_dim = config.hidden_size / config.num_attention_heads;
        Ok(Self {
            patch_weight: super::siglip::conv_weight(w.take("embeddings.patch_embedding.weight")?)?,
            patch_bias: match clip {
                true => None,
                false => Some(w.take("embeddings.patch_embedding.bias")?),
            },
            class_embedding: match clip {
                true => Some(w.take("embeddings.class_embedding")?),
                false => None,
            },
            position_embedding: position_embedding.expand_dims(0)?,
            pre_layrnorm: match clip {
                true => Some(w.layer_norm("pre_layrnorm", PRE_LAYERNORM_EPS)?),
                false => None,
            },
            layers: built,
            heads: config.num_attention_heads,
            scale: (head_dim as f64).powf(-0.5) as f32,
            patch_size: config.patch_size,
        })
    }

    /// The hidden states `(B, positions, hidden)` for images `(B, H, W, C)` (channels last), as
    /// mlx-vlm's `output_hidden_states` lists them: index 0 the embeddings (after the
    /// pre-LayerNorm), index i the output of layer i; only the indices in `wanted`, in order.
    pub fn hidden_states(&self, pixels: &Array, wanted: &[usize]) -> Result<Vec<Array>> {
        let p = self.patch_size;
        let mut x = ops::conv2d(pixels, &self.patch_weight, (p, p), None, None, None)?;
        if let Some(bias) = &self.patch_bias {
            x = x.add(bias)?;
        }
        let (b, d) = (x.dim(0), x.dim(-1));
        x = x.reshape(&[b, -1, d])?;
        if let Some(class) = &self.class_embedding {
            let cls = ops::broadcast_to(class, &[b, 1, d])?;
            x = ops::concatenate(&[cls, x], 1)?;
        }
        x = x.add(&self.position_embedding)?;
        if let Some(norm) = &self.pre_layrnorm {
            x = norm.forward(&x)?;
        }
        let mut states = vec![None; self.layers.len() + 1];
        if wanted.contains(&0) {
            states[0] = Some(x.clone());
        }
        let last = wanted.iter().copied().max().unwrap_or(0);
        for (i, layer) in self.layers.iter().enumerate().take(last) {
            x = layer.forward(&x, self.heads, self.scale, quick_gelu)?;
            if wanted.contains(&(i + 1)) {
                states[i + 1] = Some(x.clone());
            }
        }
        wanted
            .iter()
            .map(|&i| {
                states[i]
                    .clone()
                    .ok_or_else(|| mlx_rs::error::Exception::custom(format!("no hidden state {i}")))
            })
            .collect()
    }
}
