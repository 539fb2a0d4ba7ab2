//! The SigLIP vision transformer (Gemma 3's tower; LLaVA- and Idefics3-style models use it too),
//! as mlx-vlm's `SigLipVisionModel` computes it: a strided convolution cuts the image into
//! patches, learned position embeddings are added, pre-norm encoder layers (LayerNorm,
//! attention with biases, tanh-GELU MLP), and a final LayerNorm.

use mlx_rs::{ops, Array};
use serde::Deserialize;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::{gelu_approx, LayerNorm, Linear, Result},
};

/// `vision_config` of config.json, with mlx-vlm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct SiglipConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    pub patch_size: i32,
    #[serde(default = "default_image_size")]
    pub image_size: i32,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f32,
}

fn default_image_size() -> i32 {
    224
}
fn default_layer_norm_eps() -> f32 {
    1e-6
}

impl SiglipConfig {
    /// Patches along one side of the (square) image.
    pub fn patches_per_side(&self) -> i32 {
        self.image_size / self.patch_size
    }
}

/// mlx-vlm builds the final norm as `nn.LayerNorm(hidden_size)`: MLX's default eps, not the
/// config's `layer_norm_eps` (transformers uses the config's).
const POST_LAYERNORM_EPS: f32 = 1e-5;

/// A pre-norm ViT encoder layer (SigLIP's and CLIP's): LayerNorm, attention with biases over
/// all positions, LayerNorm, MLP `fc2(act(fc1))`; the activation is the tower's.
pub(super) struct EncoderLayer {
    layer_norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    /// The layer under `p` (`encoder.layers.{i}`), mlx-vlm's names.
    pub(super) fn load(
        w: &mut Weights,
        p: &str,
        eps: f32,
    ) -> std::result::Result<Self, EngineError> {
        Ok(Self {
            layer_norm1: w.layer_norm(&format!("{p}.layer_norm1"), eps)?,
            q_proj: w.linear(&format!("{p}.self_attn.q_proj"))?,
            k_proj: w.linear(&format!("{p}.self_attn.k_proj"))?,
            v_proj: w.linear(&format!("{p}.self_attn.v_proj"))?,
            out_proj: w.linear(&format!("{p}.self_attn.out_proj"))?,
            layer_norm2: w.layer_norm(&format!("{p}.layer_norm2"), eps)?,
            fc1: w.linear(&format!("{p}.mlp.fc1"))?,
            fc2: w.linear(&format!("{p}.mlp.fc2"))?,
        })
    }

    /// `x` `(B, N, hidden)` through the layer, `heads` attention heads scaled by `scale`.
    pub(super) fn forward(
        &self,
        x: &Array,
        heads: i32,
        scale: f32,
        act: fn(&Array) -> Result<Array>,
    ) -> Result<Array> {
        let h = self.layer_norm1.forward(x)?;
        let h = x.add(self.attention(&h, heads, scale)?)?;
        let r = self
            .fc2
            .forward(&act(&self.fc1.forward(&self.layer_norm2.forward(&h)?)?)?)?;
        h.add(&r)
    }

    fn attention(&self, x: &Array, heads: i32, scale: f32) -> Result<Array> {
        let (b, n) = (x.dim(0), x.dim(1));
        let split = |t: Array| -> Result<Array> {
            t.reshape(&[b, n, heads, -1])?.transpose_axes(&[0, 2, 1, 3])
        };
        let q = split(self.q_proj.forward(x)?)?;
        let k = split(self.k_proj.forward(x)?)?;
        let v = split(self.v_proj.forward(x)?)?;
        let o = crate::layers::sdpa::sdpa(&q, &k, &v, scale, None, None)?;
        self.out_proj
            .forward(&o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, n, -1])?)
    }
}

pub struct SiglipTower {
    /// `(hidden, patch, patch, channels)`: MLX's convolution layout.
    patch_weight: Array,
    patch_bias: Array,
    /// `(1, patches, hidden)`.
    position_embedding: Array,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
    heads: i32,
    /// `head_dim^-0.5`, computed in f64 as Python does.
    scale: f32,
    patch_size: i32,
}

impl SiglipTower {
    /// The tower from tensors named as under mlx-vlm's `vision_tower.vision_model.`.
    pub fn load(config: &SiglipConfig, w: &mut Weights) -> std::result::Result<Self, EngineError> {
        let eps = config.layer_norm_eps;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            layers.push(EncoderLayer::load(w, &format!("encoder.layers.{i}"), eps)?);
        }
        let position_embedding = w.take("embeddings.position_embedding.weight")?;
        let position_embedding = position_embedding.expand_dims(0)?;
        let head_dim = config.hidden_size / config.num_attention_heads;
        Ok(Self {
            patch_weight: conv_weight(w.take("embeddings.patch_embedding.weight")?)?,
            patch_bias: w.take("embeddings.patch_embedding.bias")?,
            position_embedding,
            layers,
            post_layernorm: w.layer_norm("post_layernorm", POST_LAYERNORM_EPS)?,
            heads: config.num_attention_heads,
            scale: (head_dim as f64).powf(-0.5) as f32,
            patch_size: config.patch_size,
        })
    }

    /// Hidden states `(B, patches, hidden)` for images `(B, H, W, C)` (channels last).
    pub fn forward(&self, pixels: &Array) -> Result<Array> {
        self.encode(self.embed(pixels)?)
    }

    /// The patch embeddings plus position embeddings, `(B, patches, hidden)`.
    pub fn embed(&self, pixels: &Array) -> Result<Array> {
        let p = self.patch_size;
        let x = ops::conv2d(pixels, &self.patch_weight, (p, p), None, None, None)?
            .add(&self.patch_bias)?;
        let (b, d) = (x.dim(0), x.dim(-1));
        x.reshape(&[b, -1, d])?.add(&self.position_embedding)
    }

    /// Embeddings through the encoder layers and the final LayerNorm.
    pub fn encode(&self, mut x: Array) -> Result<Array> {
        for layer in &self.layers {
            x = layer.forward(&x, self.heads, self.scale, gelu_approx)?;
        }
        self.post_layernorm.forward(&x)
    }

    /// Patch k takes the position embedding `ids[k]` instead of the k-th (Idefics3's bucketed
    /// patch grid); `ids` `(patches,)`.
    pub fn select_positions(&mut self, ids: &Array) -> Result<()> {
        let table = self.position_embedding.squeeze_axes(&[0])?;
        self.position_embedding = table.take_axis(ids, 0)?.expand_dims(0)?;
        Ok(())
    }

    /// The dtype of the tower's weights.
    pub fn dtype(&self) -> mlx_rs::Dtype {
        self.patch_weight.dtype()
    }
}

/// A patch convolution's weight in MLX's `(out, kh, kw, in)` layout. PyTorch checkpoints store
/// `(out, in, kh, kw)`; MLX conversions already hold MLX's. mlx-vlm's test: MLX's layout has
/// `out` at least as large as both kernel sides, and the two kernel sides equal.
pub(super) fn conv_weight(w: Array) -> Result<Array> {
    let s = w.shape();
    let mlx_layout = s.len() == 4 && s[0] >= s[1] && s[0] >= s[2] && s[1] == s[2];
    match mlx_layout {
        true => Ok(w),
        false => w.transpose_axes(&[0, 2, 3, 1]),
    }
}
