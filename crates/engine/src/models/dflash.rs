//! A DFlash block drafter (z-lab's DFlash releases; mlx-vlm's `qwen3_dflash` drafter): a small
//! companion checkpoint that drafts a whole block in one pass. Its context is the model's
//! hidden states at a few of its layers (`dflash_config.target_layer_ids`), joined, projected to
//! the hidden size (`fc`) and normed (`hidden_norm`); each of its layers projects the context to
//! keys and values kept in its cache. The block is the last token taken followed by mask tokens
//! (`dflash_config.mask_token_id`), embedded with the model's embedding; it attends to the
//! cached context and to itself, not causally, and the model's head over its normed output
//! gives one guess per mask. Two variants share it: DFlash2 (`dflash2.rs`: convolutions around
//! each sublayer, guesses picked among the head's best by a selector) and DSpark (`dspark.rs`:
//! a Markov head chains the guesses; the last token's own position guesses too).

use mlx_rs::{ops, Array};
use serde_json::Value;

use super::{
    dflash2::{CandidateSelector, Dflash2Fields, GroupedConv},
    dspark::MarkovHead,
    model::LanguageModel,
};
use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::KvCache,
    layers::rope::{rope_from_config, Rope},
    layers::sdpa::sdpa,
    layers::weights::Weights,
    layers::{
        scalar_like, soft_cap, Activation, Embedding, GateUp, GatedMlp, Linear, Result, RmsNorm,
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// Which block drafter a config.json describes, as mlx-vlm tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Dflash,
    /// `architectures` names `DFlash2DraftModel`.
    Dflash2,
    /// `dflash_config.projector_type` is `dspark` or a `markov_rank` is set.
    Dspark,
}

/// How a block's hidden states become guesses.
pub enum Proposer {
    /// The head's best token at each mask.
    Head,
    /// DFlash2: one of the head's best few, scored with the guess before it.
    Selector(CandidateSelector),
    /// DSpark: the head's logits plus a transition from the guess before it.
    Markov(MarkovHead),
}

/// A DFlash drafter, loaded from its own directory ([`DFlash::kind`] its config.json).
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
    pub kind: BlockKind,
    pub proposer: Proposer,
    /// DSpark's own embedding, where its release ships one (the model's otherwise).
    embedding: Option<Embedding>,
    /// DFlash2's factors on the block's embeddings and on the logits.
    input_scale: f32,
    output_multiplier: f32,
    softcap: Option<f32>,
    /// DSpark: the last token's position guesses the first token (no mask for it).
    from_anchor: bool,
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
    /// DFlash2: the convolutions around the attention and the MLP.
    convs: Option<(GroupedConv, GroupedConv)>,
}

impl DFlash {
    /// Which block drafter config.json describes (its `dflash_config`), if any: mlx-vlm's
    /// order, DFlash2 by name, then DSpark by its projector or Markov rank.
    pub fn kind(config: &Value) -> Option<BlockKind> {
        let dflash = config.get("dflash_config")?;
        let named = |name: &str| {
            (config["architectures"].as_array()).is_some_and(|a| a.iter().any(|n| n == name))
        };
        let markov = |v: &Value| v.get("markov_rank").and_then(Value::as_u64).unwrap_or(0) > 0;
        Some(if named("DFlash2DraftModel") {
            BlockKind::Dflash2
        } else if named("Gemma4DSparkModel")
            || dflash.get("projector_type").is_some_and(|p| p == "dspark")
            || markov(config)
            || markov(dflash)
        {
            BlockKind::Dspark
        } else {
            BlockKind::Dflash
        })
    }

    /// The drafter of `config` (see [`Self::kind`]) for a model of `hidden` features and
    /// `layers` layers.
    pub fn load(
        config: &Value,
        mut weights: Weights,
        hidden: i32,
        layers: usize,
    ) -> LoadResult<Self> {
        let Some(kind) = Self::kind(config) else {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                "the drafter's config.json has no `dflash_config`",
            ));
        };
        // Made for another model: the request's mistake, named by its field.
        let refuse = |reason: String| EngineError::InvalidParams {
            field: "draft_model".into(),
            reason,
        };
        let unsupported = |what: &str| {
            EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!("{what} is not supported: use a drafter with full block attention"),
            )
        };
        let broken = |what: String| EngineError::load(LoadErrorKind::InvalidWeights, what);
        let dflash = &config["dflash_config"];
        // DFlash2 reads its fields from `dflash_config` first; the others from the top level.
        let field = |key: &str| {
            match kind {
                BlockKind::Dflash2 => dflash.get(key).or(config.get(key)),
                _ => config.get(key),
            }
            .and_then(Value::as_f64)
        };
        let int = |key: &str| config.get(key).and_then(Value::as_i64);
        let need = |key: &str| {
            int(key).ok_or_else(|| broken(format!("the drafter's config.json has no `{key}`")))
        };
        if (config["architectures"].as_array())
            .is_some_and(|a| a.iter().any(|n| n == "Gemma4DSparkModel"))
        {
            return Err(unsupported(
                "Gemma 4's DSpark drafter (`Gemma4DSparkModel`)",
            ));
        }
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
        // Causal, windowed or sink-biased variants attend otherwise: refused rather than
        // drafted wrong.
        let causal = dflash["causal"].as_bool().unwrap_or(false)
            || config["dflash_query_causal"].as_bool().unwrap_or(false)
            || config["is_causal"].as_bool().unwrap_or(false);
        let windowed = config.get("sliding_window").is_some_and(|w| !w.is_null())
            || dflash.get("swa_window_size").is_some_and(|w| !w.is_null());
        if causal || windowed {
            return Err(unsupported(
                "a block drafter with causal or sliding-window attention",
            ));
        }
        if dflash["attention_sink_bias"].as_bool().unwrap_or(false) {
            return Err(unsupported("a block drafter with attention sinks"));
        }
        let block_size = match kind {
            BlockKind::Dflash => int("block_size").unwrap_or(16),
            BlockKind::Dflash2 => field("block_size").map_or(16, |b| b as i64),
            // DSpark's checkpoints count the guesses only, unless they say the anchor is in.
            BlockKind::Dspark => {
                let raw = (dflash.get("block_size").or(config.get("block_size")))
                    .and_then(Value::as_i64)
                    .ok_or_else(|| {
                        broken("the DSpark drafter's config has no `block_size`".into())
                    })?;
                raw + i64::from(!config["dspark_bonus_anchor"].as_bool().unwrap_or(false))
            }
        };
        // Releases store the drafter under `model.` or at the top level.
        weights.rename_prefix("model.", "");
        let flash2 = match kind {
            BlockKind::Dflash2 => Some(Dflash2Fields::read(&field).ok_or_else(|| {
                broken(
                    "the DFlash2 drafter's dflash_config lacks conv_kernel_size, \
                     conv_group_size or selector_top_k"
                        .into(),
                )
            })?),
            _ => None,
        };
        if let Some(f) = &flash2 {
            let vocab = need("vocab_size")?;
            if i64::from(f.top_k) > vocab {
                return Err(broken(format!(
                    "the DFlash2 drafter's selector_top_k {} is more than its vocabulary of \
                     {vocab} tokens",
                    f.top_k
                )));
            }
            if f.conv_group <= 0 || hidden % f.conv_group != 0 || f.conv_kernel <= 0 || f.top_k <= 0
            {
                return Err(broken(format!(
                    "the DFlash2 drafter's conv_group_size {} must divide hidden_size {hidden}, \
                     its conv_kernel_size {} and selector_top_k {} be positive",
                    f.conv_group, f.conv_kernel, f.top_k
                )));
            }
        }
        let count = need("num_hidden_layers")? as usize;
        let layers = (0..count)
            .map(|i| Layer::load(&mut weights, &format!("layers.{i}"), eps, flash2.as_ref()))
            .collect::<LoadResult<_>>()?;
        let proposer = match (&flash2, kind) {
            (Some(f), _) => Proposer::Selector(CandidateSelector::load(&mut weights, f.top_k)?),
            (None, BlockKind::Dspark) => {
                if dflash["markov_head_type"]
                    .as_str()
                    .is_some_and(|t| t != "vanilla")
                {
                    return Err(unsupported("a DSpark Markov head other than `vanilla`"));
                }
                Proposer::Markov(MarkovHead::load(&mut weights)?)
            }
            _ => Proposer::Head,
        };
        let embedding = match kind == BlockKind::Dspark && weights.contains("embed_tokens.weight") {
            true => Some(weights.embedding("embed_tokens")?),
            false => None,
        };
        let drafter = Self {
            fc: weights.linear("fc")?,
            hidden_norm: weights.rms_norm("hidden_norm", eps)?,
            layers,
            norm: weights.rms_norm("norm", eps)?,
            rope,
            heads: need("num_attention_heads")? as i32,
            kv_heads: need("num_key_value_heads")? as i32,
            head_dim,
            block_size: block_size.max(2) as usize,
            mask_token: mask_token as u32,
            target_layers,
            kind,
            proposer,
            embedding,
            input_scale: flash2.as_ref().map_or(1.0, |f| f.input_scale),
            output_multiplier: flash2.as_ref().map_or(1.0, |f| f.output_multiplier),
            softcap: field("final_logit_softcapping").map(|c| c as f32),
            from_anchor: kind == BlockKind::Dspark
                && dflash["sample_from_anchor"].as_bool().unwrap_or(true),
        };
        drafter.check(hidden)?;
        Ok(drafter)
    }

    /// The block's tokens for `limit` guesses after the last token taken, `last`: the last
    /// token and a mask per guess (DSpark drafting from the anchor: one mask fewer).
    pub fn block(&self, last: u32, limit: usize) -> Vec<u32> {
        let masks = limit - usize::from(self.from_anchor);
        std::iter::once(last)
            .chain(std::iter::repeat_n(self.mask_token, masks))
            .collect()
    }

    /// The positions of the block whose outputs are the guesses.
    pub fn guess_positions(&self, limit: usize) -> std::ops::Range<i32> {
        let first = i32::from(!self.from_anchor);
        first..first + limit as i32
    }

    /// The block's embeddings `(1, B, H)`: its own table (DSpark) or the model's, times
    /// DFlash2's input scale.
    pub fn embed(&self, model: &dyn LanguageModel, block: &Array) -> Result<Array> {
        let h = match &self.embedding {
            Some(table) => table.forward(block)?,
            None => model.embed(block)?,
        };
        match self.input_scale {
            1.0 => Ok(h),
            s => h.multiply(scalar_like(s, &h)?),
        }
    }

    /// The logits of the guesses' hidden states `h`: the model's head (a drafter with its own
    /// embedding on a model without its own head projects with that embedding, as mlx-vlm
    /// binds it), times DFlash2's output multiplier, soft-capped where the drafter says.
    pub fn logits(&self, model: &dyn LanguageModel, h: &Array) -> Result<Array> {
        let logits = match (&self.embedding, model.has_lm_head()) {
            (Some(table), false) => table.as_linear(h)?,
            _ => model.head_logits(h)?,
        };
        let logits = match self.output_multiplier {
            1.0 => logits,
            m => logits.multiply(scalar_like(m, &logits)?)?,
        };
        soft_cap(logits, self.softcap)
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
    /// hidden)` ([`Self::embed`]), after the new context `context` `(1, S, layers * hidden)` (the model's hidden
    /// states of the positions taken since the last call) joins the caches.
    pub fn forward(&self, block: &Array, context: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let context = self.hidden_norm.forward(&self.fc.forward(context)?)?;
        let mut h = block.clone();
        for (layer, cache) in self.layers.iter().zip(caches) {
            let x = layer.input_layernorm.forward(&h)?;
            let attended = match &layer.convs {
                None => self.attend(layer, &x, &context, cache)?,
                Some((conv, _)) => {
                    let (x, kernel) = conv.prepare(&x)?;
                    conv.finish(&self.attend(layer, &x, &context, cache)?, &kernel)?
                }
            };
            h = h.add(attended)?;
            let x = layer.post_attention_layernorm.forward(&h)?;
            let transformed = match &layer.convs {
                None => layer.mlp.forward(&x)?,
                Some((_, conv)) => {
                    let (x, kernel) = conv.prepare(&x)?;
                    conv.finish(&layer.mlp.forward(&x)?, &kernel)?
                }
            };
            h = h.add(transformed)?;
        }
        self.norm.forward(&h)
    }

    /// A layer's keys and values of the projected `context` `(1, S, H)`, rotated at the
    /// positions after its cache's, appended to it: the cache's keys and values after.
    fn cache_context(
        &self,
        layer: &Layer,
        context: &Array,
        cache: &mut KvCache,
    ) -> Result<(Array, Array)> {
        let heads = |a: Array| a.reshape(&[context.dim(0), context.dim(1), self.kv_heads, -1]);
        let t = |a: Array| a.transpose_axes(&[0, 2, 1, 3]);
        let ck = layer
            .k_norm
            .forward(&heads(layer.k_proj.forward(context)?)?)?;
        let cv = heads(layer.v_proj.forward(context)?)?;
        let ck = self.rope.forward(&t(ck)?, cache.offset())?;
        cache.update_and_fetch(ck, t(cv)?)
    }

    /// Appends the context of the model's hidden states `context` `(1, S, layers * H)` to
    /// `caches` without drafting (what [`Self::forward`] appends), so that they hold the
    /// positions the model's caches do.
    pub fn remember(&self, context: &Array, caches: &mut [KvCache]) -> Result<()> {
        let context = self.hidden_norm.forward(&self.fc.forward(context)?)?;
        for (layer, cache) in self.layers.iter().zip(caches) {
            self.cache_context(layer, &context, cache)?;
        }
        Ok(())
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
        let t = |a: Array| a.transpose_axes(&[0, 2, 1, 3]);
        let after = cache.offset() + context.dim(1);
        let q = self.rope.forward(&t(q)?, after)?;
        let k = self.rope.forward(&t(k)?, after)?;
        let (ck, cv) = self.cache_context(layer, context, cache)?;
        let keys = ops::concatenate(&[ck, k], 2)?;
        let values = ops::concatenate(&[cv, t(v)?], 2)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let o = sdpa(&q, &keys, &values, scale, None, None)?;
        layer.o_proj.forward(&t(o)?.reshape(&[b, l, -1])?)
    }
}

impl Layer {
    fn load(
        weights: &mut Weights,
        p: &str,
        eps: f32,
        flash2: Option<&Dflash2Fields>,
    ) -> LoadResult<Self> {
        let conv = |weights: &mut Weights, name: &str, f: &Dflash2Fields| {
            GroupedConv::load(weights, &format!("{p}.{name}"), f.conv_kernel, f.conv_group)
        };
        let convs = match flash2 {
            Some(f) => Some((
                conv(weights, "attention_conv", f)?,
                conv(weights, "mlp_conv", f)?,
            )),
            None => None,
        };
        Ok(Self {
            convs,
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
