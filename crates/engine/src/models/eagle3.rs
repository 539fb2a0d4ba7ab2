//! An EAGLE-3 drafter (the speculators releases mlx-vlm 0.7 reads; its `eagle3` drafter): a
//! one-or-few-layer Llama beside the model that guesses the next token from the token before
//! it and a hidden state. Over the model's positions that hidden state is the model's own at
//! three of its layers (the outputs of the layers before `eagle_aux_hidden_state_layer_ids`),
//! joined and projected to its width (`fc`); chaining guesses, its own output. Its first layer
//! attends over the normed token embedding beside the normed hidden state (twice its width);
//! its head covers a draft vocabulary whose ids map into the model's by `d2t`. It runs as the
//! model's multi-token-prediction head runs (`generate/drafters.rs`'s chain drafter).

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::KvCache,
    layers::rope::{rope_from_config, Rope},
    layers::sdpa::sdpa,
    layers::weights::Weights,
    layers::{Activation, Embedding, GateUp, GatedMlp, Linear, Result, RmsNorm},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

pub struct Eagle3 {
    fc: Linear,
    /// `norm_before_fc`: the joined hidden states normed before `fc`.
    input_norm: Option<RmsNorm>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// Its own head over the draft vocabulary, or (tied) the embedding's table.
    lm_head: Option<Linear>,
    /// Its own embedding, where its shape is not the model's (else the model's, as mlx-vlm
    /// binds it).
    embedding: Option<Embedding>,
    /// The model's token id of each draft token: `i + d2t[i]` `(Vd,)`; none when the
    /// vocabularies are the same.
    targets: Option<Array>,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    hidden: i32,
    norm_before_residual: bool,
    /// The model's layers whose outputs are its context, in this order.
    pub capture_layers: Vec<usize>,
    /// Tokens per verification: the last token taken and `block_size - 1` guesses.
    pub block_size: usize,
}

struct Layer {
    input_layernorm: RmsNorm,
    /// The first layer's: the hidden state's norm beside the embedding's.
    hidden_norm: Option<RmsNorm>,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    post_attention_layernorm: RmsNorm,
    mlp: GatedMlp,
}

impl Eagle3 {
    /// Whether config.json describes an EAGLE-3 drafter (mlx-vlm reads the speculators format
    /// only).
    pub fn is_eagle3(config: &Value) -> bool {
        let named = |key: &str| config.get(key).is_some_and(|t| t == "eagle3");
        named("model_type") || named("speculators_model_type")
    }

    /// The drafter of `config` for a model of `hidden` features, `layers` layers and an
    /// embedding of `rows` x `hidden`.
    pub fn load(
        config: &Value,
        mut weights: Weights,
        hidden: i32,
        layers: usize,
        rows: i32,
    ) -> LoadResult<Self> {
        let refuse = |reason: String| EngineError::InvalidParams {
            field: "draft_model".into(),
            reason,
        };
        let broken = |what: String| EngineError::load(LoadErrorKind::InvalidWeights, what);
        let text = &config["transformer_layer_config"];
        let int = |v: &Value, key: &str| v.get(key).and_then(Value::as_i64);
        let need = |key: &str| {
            int(text, key).ok_or_else(|| {
                broken(format!(
                    "the EAGLE-3 drafter's transformer_layer_config has no `{key}`"
                ))
            })
        };
        let width = need("hidden_size")? as i32;
        let heads = need("num_attention_heads")? as i32;
        if heads <= 0 || width <= 0 {
            return Err(broken(format!(
                "the EAGLE-3 drafter's transformer_layer_config gives {heads} heads of a \
                 {width}-wide layer: the drafter's config is damaged"
            )));
        }
        let count = need("num_hidden_layers")?;
        let target_hidden = int(config, "target_hidden_size").unwrap_or(i64::from(width));
        if target_hidden != i64::from(hidden) {
            return Err(refuse(format!(
                "the EAGLE-3 drafter reads hidden states of {target_hidden} features, the \
                 model's have {hidden}: the drafter was made for another model"
            )));
        }
        // mlx-vlm's defaults: the layers after 2, the middle and the third last of its own
        // count; it captures the output of the layer before each.
        let ids = (config.get("target_layer_ids"))
            .or(config.get("eagle_aux_hidden_state_layer_ids"))
            .and_then(Value::as_array)
            .filter(|ids| !ids.is_empty())
            .map(|ids| ids.iter().filter_map(Value::as_i64).collect::<Vec<_>>())
            .unwrap_or_else(|| vec![2, count / 2, (count - 3).max(0)]);
        let capture_layers: Vec<usize> = ids.iter().map(|&i| (i - 1).max(0) as usize).collect();
        if capture_layers.iter().any(|&i| i >= layers) {
            return Err(refuse(format!(
                "the EAGLE-3 drafter reads the model's layers {ids:?}, the model has {layers}: \
                 the drafter was made for another model"
            )));
        }
        let vocab = need("vocab_size")?;
        if vocab != i64::from(rows) {
            return Err(refuse(format!(
                "the EAGLE-3 drafter's vocabulary has {vocab} tokens, the model's {rows}: the \
                 drafter was made for another model"
            )));
        }
        let draft_vocab = int(config, "draft_vocab_size").unwrap_or(32000);
        let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false);
        let eps = text["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32;
        let head_dim = int(text, "head_dim").map_or_else(|| width / heads, |d| d as i32);
        let theta = (text.pointer("/rope_parameters/rope_theta"))
            .or(text.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0) as f32;
        let traditional = text["rope_traditional"].as_bool().unwrap_or(false);
        let rope = rope_from_config(head_dim, theta, traditional, None, None)?;
        let block_size = int(config, "block_size")
            .or(config
                .pointer("/speculators_config/proposal_methods/0/speculative_tokens")
                .and_then(Value::as_i64)
                .map(|n| n + 2))
            .unwrap_or(5);

        let norm_before_fc = config["norm_before_fc"].as_bool().unwrap_or(false);
        // What mlx-vlm's sanitize drops: the reverse map, the verifier's own tensors.
        weights.remove("t2d");
        weights.drop_prefixed("verifier_");
        let layers = (0..count)
            .map(|i| Layer::load(&mut weights, &format!("layers.{i}"), eps, i == 0))
            .collect::<LoadResult<_>>()?;
        let targets = match draft_vocab != vocab {
            true => {
                let d2t = weights.take("d2t")?.as_dtype(mlx_rs::Dtype::Int32)?;
                let ids = ops::arange::<_, i32>(0, d2t.dim(0), 1)?;
                Some(ids.add(d2t)?.as_dtype(mlx_rs::Dtype::Uint32)?)
            }
            false => None,
        };
        // mlx-vlm binds the model's embedding where the shapes agree.
        let embedding = match weights.shape("embed_tokens.weight") {
            Some(&[r, h]) if (r, h) != (rows, hidden) => Some(weights.embedding("embed_tokens")?),
            _ => {
                weights.remove("embed_tokens.weight");
                None
            }
        };
        let lm_head = match tied && targets.is_none() {
            true if embedding.is_none() => {
                return Err(EngineError::load(
                    LoadErrorKind::UnsupportedArchitecture,
                    "an EAGLE-3 drafter whose head is the model's embedding is not supported: \
                     use one with its own lm_head",
                ))
            }
            true => None,
            false => Some(weights.linear("lm_head")?),
        };
        let input_norm = match norm_before_fc {
            true => Some(weights.rms_norm("input_norm", eps)?),
            false => {
                weights.remove("input_norm.weight");
                None
            }
        };
        let drafter = Self {
            fc: weights.linear("fc")?,
            input_norm,
            layers,
            norm: weights.rms_norm("norm", eps)?,
            lm_head,
            embedding,
            targets,
            rope,
            heads,
            kv_heads: need("num_key_value_heads")? as i32,
            head_dim,
            hidden: width,
            norm_before_residual: config["norm_before_residual"].as_bool().unwrap_or(false),
            capture_layers,
            block_size: block_size.max(2) as usize,
        };
        if drafter.fc.dims() != (width, 3 * hidden) {
            return Err(broken(format!(
                "the EAGLE-3 drafter's fc is {:?}, its config makes it {width}x{}: the \
                 drafter's files do not agree with its config",
                drafter.fc.dims(),
                3 * hidden
            )));
        }
        Ok(drafter)
    }

    /// One cache per layer.
    pub fn caches(&self) -> Vec<KvCache> {
        self.layers.iter().map(|_| KvCache::default()).collect()
    }

    /// Its own embedding, where the model's does not serve.
    pub fn embedding(&self) -> Option<&Embedding> {
        self.embedding.as_ref()
    }

    /// Its hidden states `(1, L, H)` over embeddings `embeds` `(1, L, H)` and hidden states
    /// `hidden` `(1, L, _)`: the model's (joined, projected) or its own.
    pub fn forward(&self, embeds: &Array, hidden: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let mut h = match hidden.dim(-1) == self.hidden {
            true => hidden.clone(),
            false => match &self.input_norm {
                Some(norm) => self.fc.forward(&norm.forward(hidden)?)?,
                None => self.fc.forward(hidden)?,
            },
        };
        for (layer, cache) in self.layers.iter().zip(caches) {
            h = match &layer.hidden_norm {
                Some(hidden_norm) => {
                    let embeds = layer.input_layernorm.forward(embeds)?;
                    let normed = hidden_norm.forward(&h)?;
                    let residual = if self.norm_before_residual {
                        &normed
                    } else {
                        &h
                    };
                    let joined = ops::concatenate(&[embeds, normed.clone()], -1)?;
                    residual.add(self.attend(layer, &joined, cache)?)?
                }
                None => h.add(self.attend(layer, &layer.input_layernorm.forward(&h)?, cache)?)?,
            };
            h = h.add(
                layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h)?)?,
            )?;
        }
        Ok(h)
    }

    /// The logits `(1, L, V)` over the model's vocabulary (`vocab` tokens) of its hidden
    /// states `h`: its head over the draft vocabulary, placed at the draft tokens' ids in the
    /// model's (every other token left out, so that a draw's odds are the vocabulary's).
    pub fn logits(&self, h: &Array, vocab: i32) -> Result<Array> {
        let h = self.norm.forward(h)?;
        let logits = match (&self.lm_head, &self.embedding) {
            (Some(head), _) => head.forward(&h)?,
            (None, Some(table)) => table.as_linear(&h)?,
            (None, None) => {
                return Err(mlx_rs::error::Exception::custom(
                    "an EAGLE-3 drafter without a head (refused at load)",
                ))
            }
        };
        let Some(targets) = &self.targets else {
            return Ok(logits);
        };
        let (b, l) = (logits.dim(0), logits.dim(1));
        let none = ops::full::<f32>(&[b, l, vocab], Array::from_f32(f32::NEG_INFINITY))?
            .as_dtype(logits.dtype())?;
        let at = ops::broadcast_to(targets, logits.shape())?;
        none.put_along_axis(&at, &logits, -1)
    }

    /// A layer's attention, causal over its cache, at positions one past the cache's (its
    /// first position is the model's second).
    fn attend(&self, layer: &Layer, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |a: Array, n: i32| a.reshape(&[b, l, n, -1])?.transpose_axes(&[0, 2, 1, 3]);
        let q = heads(layer.q_proj.forward(x)?, self.heads)?;
        let k = heads(layer.k_proj.forward(x)?, self.kv_heads)?;
        let v = heads(layer.v_proj.forward(x)?, self.kv_heads)?;
        let position = cache.offset() + 1;
        let mask = cache.mask(l)?;
        let q = self.rope.forward(&q, position)?;
        let k = self.rope.forward(&k, position)?;
        let (k, v) = cache.update_and_fetch(k, v)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let o = sdpa(&q, &k, &v, scale, mask.as_sdpa(), None)?;
        layer
            .o_proj
            .forward(&o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

impl Layer {
    fn load(weights: &mut Weights, p: &str, eps: f32, first: bool) -> LoadResult<Self> {
        let linear = |weights: &mut Weights, name: &str| weights.linear(&format!("{p}.{name}"));
        Ok(Self {
            input_layernorm: weights.rms_norm(&format!("{p}.input_layernorm"), eps)?,
            hidden_norm: match first {
                true => Some(weights.rms_norm(&format!("{p}.hidden_norm"), eps)?),
                false => None,
            },
            q_proj: linear(weights, "self_attn.q_proj")?,
            k_proj: linear(weights, "self_attn.k_proj")?,
            v_proj: linear(weights, "self_attn.v_proj")?,
            o_proj: linear(weights, "self_attn.o_proj")?,
            post_attention_layernorm: weights
                .rms_norm(&format!("{p}.post_attention_layernorm"), eps)?,
            mlp: GatedMlp {
                gate_up: GateUp::Split {
                    gate_proj: linear(weights, "mlp.gate_proj")?,
                    up_proj: linear(weights, "mlp.up_proj")?,
                },
                down_proj: linear(weights, "mlp.down_proj")?,
                activation: Activation::Silu,
            },
        })
    }
}
