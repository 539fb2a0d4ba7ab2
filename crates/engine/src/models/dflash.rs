//! A DFlash block drafter (z-lab's DFlash releases; mlx-vlm's `qwen3_dflash` drafter): a small
//! companion checkpoint that drafts a whole block in one pass. Its context is the model's
//! hidden states at a few of its layers (`dflash_config.target_layer_ids`), joined, projected to
//! the hidden size (`fc`) and normed (`hidden_norm`); each of its layers projects the context to
//! keys and values kept in its cache. The block is the last token taken followed by
//! `block_size - 1` mask tokens (`dflash_config.mask_token_id`), embedded with the model's
//! embedding; it attends to the cached context and to itself, not causally, and the model's head
//! over its normed output (but the first position) gives one guess per mask.

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::KvCache,
    layers::rope::{rope_from_config, Rope},
    layers::sdpa::sdpa,
    layers::weights::Weights,
    layers::{Activation, GateUp, GatedMlp, Linear, Result, RmsNorm},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// A DFlash drafter, loaded from its own directory ([`DFlash::is_dflash`] its config.json).
pub struct DFlash {
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    /// Tokens per block: the last token taken and `block_size - 1` guesses.
    pub block_size: usize,
    pub mask_token: u32,
    /// The model's layers whose outputs are the context, in this order.
    pub target_layers: Vec<usize>,
}

struct Layer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    mlp: GatedMlp,
}

impl DFlash {
    /// Whether config.json describes a DFlash block drafter (its `dflash_config`; not the
    /// DFlash2 and DSpark variants, which mlx-vlm builds otherwise).
    pub fn is_dflash(config: &Value) -> bool {
        let Some(dflash) = config.get("dflash_config") else {
            return false;
        };
        let architectures = config["architectures"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let named = |name: &str| architectures.iter().any(|a| a == name);
        let markov = |v: &Value| v.get("markov_rank").and_then(Value::as_u64).unwrap_or(0) > 0;
        !named("DFlash2DraftModel")
            && !named("Gemma4DSparkModel")
            && dflash.get("projector_type").is_none_or(|p| p != "dspark")
            && !markov(config)
            && !markov(dflash)
    }

    /// The drafter of `config` (see [`Self::is_dflash`]) for a model of `hidden` features and
    /// `layers` layers.
    pub fn load(
        config: &Value,
        mut weights: Weights,
        hidden: i32,
        layers: usize,
    ) -> LoadResult<Self> {
        // Made for another model: the request's mistake, named by its field.
        let refuse = |reason: String| EngineError::InvalidParams {
            field: "draft_model".into(),
            reason,
        };
        let broken = |what: String| EngineError::load(LoadErrorKind::InvalidWeights, what);
        let int = |key: &str| config.get(key).and_then(Value::as_i64);
        let need = |key: &str| {
            int(key).ok_or_else(|| broken(format!("the drafter's config.json has no `{key}`")))
        };
        let dflash = &config["dflash_config"];
        let target_layers: Vec<usize> = (dflash["target_layer_ids"].as_array())
            .map(|ids| {
                ids.iter()
                    .filter_map(Value::as_u64)
                    .map(|i| i as usize)
                    .collect()
            })
            .unwrap_or_default();
        if target_layers.is_empty() || target_layers.iter().any(|&i| i >= layers) {
            return Err(refuse(format!(
                "dflash_config.target_layer_ids {target_layers:?} are not layers of the model \
                 (it has {layers}): the drafter was made for another model"
            )));
        }
        if need("hidden_size")? != i64::from(hidden) {
            return Err(refuse(format!(
                "the drafter's hidden_size is {}, the model's {hidden}: the drafter was made for \
                 another model",
                need("hidden_size")?
            )));
        }
        let mask_token = (dflash.get("mask_token_id").or(config.get("mask_token_id")))
            .and_then(Value::as_u64)
            .ok_or_else(|| broken("the drafter's dflash_config has no `mask_token_id`".into()))?;
        let eps = config["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32;
        let head_dim = need("head_dim")? as i32;
        let theta = (config.get("rope_theta"))
            .or(config.pointer("/rope_parameters/rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0) as f32;
        let scaling = (config.get("rope_scaling")).filter(|s| !s.is_null());
        let neox = config["rope_is_neox_style"].as_bool().unwrap_or(true);
        let rope = rope_from_config(head_dim, theta, !neox, scaling, None)?;
        // Causal or windowed variants attend otherwise: refused rather than drafted wrong.
        let causal = dflash["causal"].as_bool().unwrap_or(false)
            || config["dflash_query_causal"].as_bool().unwrap_or(false);
        if causal || config.get("sliding_window").is_some_and(|w| !w.is_null()) {
            return Err(EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                "a DFlash drafter with causal or sliding-window attention is not supported: use \
                 one with full block attention",
            ));
        }
        // Releases store the drafter under `model.` or at the top level.
        weights.rename_prefix("model.", "");
        let count = need("num_hidden_layers")? as usize;
        let layers = (0..count)
            .map(|i| Layer::load(&mut weights, &format!("layers.{i}"), eps))
            .collect::<LoadResult<_>>()?;
        let drafter = Self {
            fc: weights.linear("fc")?,
            hidden_norm: weights.rms_norm("hidden_norm", eps)?,
            layers,
            norm: weights.rms_norm("norm", eps)?,
            rope,
            heads: need("num_attention_heads")? as i32,
            kv_heads: need("num_key_value_heads")? as i32,
            head_dim,
            block_size: int("block_size").unwrap_or(16).max(2) as usize,
            mask_token: mask_token as u32,
            target_layers,
        };
        drafter.check(hidden)?;
        Ok(drafter)
    }

    /// Refuses tensors whose shapes do not fit the config: caught here, not as a failed
    /// matrix product in the middle of a generation.
    fn check(&self, hidden: i32) -> LoadResult<()> {
        let context = self.target_layers.len() as i32 * hidden;
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut expected = vec![("fc", &self.fc, (hidden, context))];
        for layer in &self.layers {
            expected.extend([
                ("q_proj", &layer.q_proj, (q, hidden)),
                ("k_proj", &layer.k_proj, (kv, hidden)),
                ("v_proj", &layer.v_proj, (kv, hidden)),
                ("o_proj", &layer.o_proj, (hidden, q)),
            ]);
        }
        match expected.into_iter().find(|(_, l, dims)| l.dims() != *dims) {
            Some((name, l, (rows, cols))) => Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "the drafter's {name} is {:?}, its config.json makes it {rows}x{cols}: the \
                     drafter's files do not agree with its config",
                    l.dims()
                ),
            )),
            None => Ok(()),
        }
    }

    /// One cache per layer, holding the context's keys and values.
    pub fn caches(&self) -> Vec<KvCache> {
        self.layers.iter().map(|_| KvCache::default()).collect()
    }

    /// The block's normed hidden states `(1, B, hidden)` for its embeddings `block` `(1, B,
    /// hidden)`, after the new context `context` `(1, S, layers * hidden)` (the model's hidden
    /// states of the positions taken since the last call) joins the caches.
    pub fn forward(&self, block: &Array, context: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let context = self.hidden_norm.forward(&self.fc.forward(context)?)?;
        let mut h = block.clone();
        for (layer, cache) in self.layers.iter().zip(caches) {
            let attended =
                self.attend(layer, &layer.input_layernorm.forward(&h)?, &context, cache)?;
            h = h.add(attended)?;
            h = h.add(
                layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h)?)?,
            )?;
        }
        self.norm.forward(&h)
    }

    /// A layer's attention: the block's queries over the cached context's keys (at their
    /// positions) and the block's own (after them), without a mask.
    fn attend(
        &self,
        layer: &Layer,
        x: &Array,
        context: &Array,
        cache: &mut KvCache,
    ) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |a: Array, n: i32| a.reshape(&[b, a.dim(1), n, -1]);
        let q = layer
            .q_norm
            .forward(&heads(layer.q_proj.forward(x)?, self.heads)?)?;
        let k = layer
            .k_norm
            .forward(&heads(layer.k_proj.forward(x)?, self.kv_heads)?)?;
        let v = heads(layer.v_proj.forward(x)?, self.kv_heads)?;
        let ck = layer
            .k_norm
            .forward(&heads(layer.k_proj.forward(context)?, self.kv_heads)?)?;
        let cv = heads(layer.v_proj.forward(context)?, self.kv_heads)?;
        let t = |a: Array| a.transpose_axes(&[0, 2, 1, 3]);
        let (start, after) = (cache.offset(), cache.offset() + context.dim(1));
        let q = self.rope.forward(&t(q)?, after)?;
        let k = self.rope.forward(&t(k)?, after)?;
        let ck = self.rope.forward(&t(ck)?, start)?;
        let (ck, cv) = cache.update_and_fetch(ck, t(cv)?)?;
        let keys = ops::concatenate(&[ck, k], 2)?;
        let values = ops::concatenate(&[cv, t(v)?], 2)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let o = sdpa(&q, &keys, &values, scale, None, None)?;
        layer.o_proj.forward(&t(o)?.reshape(&[b, l, -1])?)
    }
}

impl Layer {
    fn load(weights: &mut Weights, p: &str, eps: f32) -> LoadResult<Self> {
        Ok(Self {
            input_layernorm: weights.rms_norm(&format!("{p}.input_layernorm"), eps)?,
            q_proj: weights.linear(&format!("{p}.self_attn.q_proj"))?,
            k_proj: weights.linear(&format!("{p}.self_attn.k_proj"))?,
            v_proj: weights.linear(&format!("{p}.self_attn.v_proj"))?,
            o_proj: weights.linear(&format!("{p}.self_attn.o_proj"))?,
            q_norm: weights.rms_norm(&format!("{p}.self_attn.q_norm"), eps)?,
            k_norm: weights.rms_norm(&format!("{p}.self_attn.k_norm"), eps)?,
            post_attention_layernorm: weights
                .rms_norm(&format!("{p}.post_attention_layernorm"), eps)?,
            mlp: GatedMlp {
                gate_up: GateUp::Split {
                    gate_proj: weights.linear(&format!("{p}.mlp.gate_proj"))?,
                    up_proj: weights.linear(&format!("{p}.mlp.up_proj"))?,
                },
                down_proj: weights.linear(&format!("{p}.mlp.down_proj"))?,
                activation: Activation::Silu,
            },
        })
    }
}
