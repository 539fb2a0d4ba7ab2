//! Llama (and the many models that share its layout: SmolLM2, TinyLlama, Llama 2/3, ...).

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    kv_cache::KvCache,
    models::{parse_args, LanguageModel},
    nn::{swiglu, AttentionShape, Embedding, Linear, Result, RmsNorm},
    rope::rope_from_config,
    weights::Weights,
};

#[derive(Debug, Deserialize)]
struct Args {
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    num_key_value_heads: Option<i32>,
    head_dim: Option<i32>,
    rms_norm_eps: f32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    rope_scaling: Option<Value>,
    max_position_embeddings: Option<usize>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_true() -> bool {
    true
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    shape: AttentionShape,
    rope: crate::nn::Rope,
}

impl Attention {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let s = &self.shape;
        let q = s.split_heads(&self.q_proj.forward(x)?, s.n_heads)?;
        let k = s.split_heads(&self.k_proj.forward(x)?, s.n_kv_heads)?;
        let v = s.split_heads(&self.v_proj.forward(x)?, s.n_kv_heads)?;
        self.o_proj.forward(&s.attend(q, k, v, &self.rope, cache)?)
    }
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&swiglu(
            &self.gate_proj.forward(x)?,
            &self.up_proj.forward(x)?,
        )?)
    }
}

struct Block {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl Block {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let h = x.add(
            self.self_attn
                .forward(&self.input_layernorm.forward(x)?, cache)?,
        )?;
        h.add(
            self.mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?,
        )
    }
}

pub struct Model {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    max_position_embeddings: Option<usize>,
}

impl Model {
    pub fn load(config: &Value, mut weights: Weights) -> std::result::Result<Self, EngineError> {
        let args: Args = parse_args(config)?;
        sanitize(&mut weights, &args);
        let n_kv_heads = args.num_key_value_heads.unwrap_or(args.num_attention_heads);
        let head_dim = args
            .head_dim
            .unwrap_or(args.hidden_size / args.num_attention_heads);
        let mut layers = Vec::with_capacity(args.num_hidden_layers);
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(Block {
                self_attn: Attention {
                    q_proj: weights.linear(&format!("{p}.self_attn.q_proj"))?,
                    k_proj: weights.linear(&format!("{p}.self_attn.k_proj"))?,
                    v_proj: weights.linear(&format!("{p}.self_attn.v_proj"))?,
                    o_proj: weights.linear(&format!("{p}.self_attn.o_proj"))?,
                    shape: AttentionShape {
                        n_heads: args.num_attention_heads,
                        n_kv_heads,
                        scale: (head_dim as f32).powf(-0.5),
                    },
                    rope: rope_from_config(
                        head_dim,
                        args.rope_theta,
                        args.rope_traditional,
                        args.rope_scaling.as_ref(),
                        args.max_position_embeddings,
                    )?,
                },
                mlp: Mlp {
                    gate_proj: weights.linear(&format!("{p}.mlp.gate_proj"))?,
                    up_proj: weights.linear(&format!("{p}.mlp.up_proj"))?,
                    down_proj: weights.linear(&format!("{p}.mlp.down_proj"))?,
                },
                input_layernorm: weights
                    .rms_norm(&format!("{p}.input_layernorm"), args.rms_norm_eps)?,
                post_attention_layernorm: weights
                    .rms_norm(&format!("{p}.post_attention_layernorm"), args.rms_norm_eps)?,
            });
        }
        Ok(Self {
            embed_tokens: weights.embedding("model.embed_tokens")?,
            layers,
            norm: weights.rms_norm("model.norm", args.rms_norm_eps)?,
            lm_head: if args.tie_word_embeddings {
                None
            } else {
                Some(weights.linear("lm_head")?)
            },
            max_position_embeddings: args.max_position_embeddings,
        })
    }
}

/// Checkpoint quirks: precomputed rotary tables, and a head stored although it is tied.
fn sanitize(weights: &mut Weights, args: &Args) {
    let unused: Vec<String> = weights
        .names()
        .filter(|n| n.contains("self_attn.rotary_emb.inv_freq"))
        .cloned()
        .collect();
    for name in unused {
        weights.remove(&name);
    }
    if args.tie_word_embeddings {
        for suffix in ["weight", "scales", "biases"] {
            weights.remove(&format!("lm_head.{suffix}"));
        }
    }
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(tokens)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache)?;
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        }
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = vec![&mut self.embed_tokens.table];
        for l in &mut self.layers {
            let (a, m) = (&mut l.self_attn, &mut l.mlp);
            out.extend([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj]);
            out.extend([&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]);
        }
        out.extend(self.lm_head.as_mut());
        out
    }

    fn max_position_embeddings(&self) -> Option<usize> {
        self.max_position_embeddings
    }
}
