//! Gemma 4 (text), as mlx-lm's gemma4_text.py runs its dense models: Gemma 3's sandwich norms,
//! GeGLU MLP and sliding/full layer pattern, with plain RMS norms (`w`, not `1 + w`), q/k norms
//! and a scale-free RMS norm on the values, attention scores unscaled (scale 1), embeddings
//! scaled by `sqrt(hidden)` in their own dtype, each block's output multiplied by its stored
//! `layer_scalar`, and the logits soft-capped: `tanh(x / cap) * cap`.
//!
//! Full-attention layers may have their own head size (`global_head_dim`), their own RoPE
//! (`rope_parameters.full_attention`: "proportional", rotating a fraction of each head), and
//! with `attention_k_eq_v` no value projection (the keys' projection gives the values) and
//! `num_global_key_value_heads` KV heads. Sliding layers get a rotating cache of
//! `sliding_window` positions.
//!
//! The small models (E2B, E4B) also have per-layer inputs: a second embedding table gives each
//! token `hidden_size_per_layer_input` features per layer, mixed with a projection of the
//! embeddings ([`PerLayerInputs`]), and each block adds its slice through a gate; and their last
//! `num_kv_shared_layers` layers have no keys and values of their own: each attends to those of
//! the last earlier layer of its kind, and has no cache. mlx-lm's defaults for both fields are
//! E2B's (256 and 20), so a config.json without them gets them.
//!
//! The mixture-of-experts model (26B-A4B, `enable_moe_block`) has in every layer a dense MLP
//! and `num_experts` GeGLU experts (`top_k_experts` per token) side by side
//! (`MlpSpec::DenseAndMoe`, Gemma 4's own router in `moe.rs`); Hugging Face's fused
//! `experts.gate_up_proj` is split as mlx-lm's sanitize splits it.

use std::collections::BTreeMap;

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec, Routing, PROJECTIONS},
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{self, scalar_like, Activation, AttentionShape, QkNormOver},
    models::{
        decoder::{sanitize, Decoder, DecoderSpec, Family, LayerSpec, MlpSpec, NormLayout},
        model::parse_args,
    },
};

/// Gemma 4's own computations, as mlx-lm's gemma4_text.py does them.
pub struct Gemma4 {
    embed_scale: f32,
    softcap: Option<f32>,
    per_layer: Option<PerLayerInputs>,
    rms_norm_eps: f32,
    /// Per layer this rank runs, by checkpoint index: what follows its block.
    finish: BTreeMap<usize, LayerFinish>,
}

/// What Gemma 4 adds after a layer's block: the per-layer input gate (small models), then the
/// stored `layer_scalar`.
struct LayerFinish {
    gate: Option<PerLayerGate>,
    layer_scalar: Array,
}

/// Gemma 4's per-layer input gate: `h + norm(projection(gelu_approx(gate(h)) * input))`
/// (Gemma 3n's adds the norm's output to other streams than `h`'s: [`Self::delta`]).
pub(super) struct PerLayerGate {
    pub(super) per_layer_input_gate: layers::Linear,
    pub(super) per_layer_projection: layers::Linear,
    pub(super) post_per_layer_input_norm: layers::RmsNorm,
}

impl PerLayerGate {
    /// The gate's tensors under `p` (`model.layers.N`), the norm's weight as stored.
    pub(super) fn load(weights: &mut Weights, p: &str, eps: f32) -> Result<Self, EngineError> {
        Ok(Self {
            per_layer_input_gate: weights.linear(&format!("{p}.per_layer_input_gate"))?,
            per_layer_projection: weights.linear(&format!("{p}.per_layer_projection"))?,
            post_per_layer_input_norm: weights
                .rms_norm(&format!("{p}.post_per_layer_input_norm"), eps)?,
        })
    }

    fn forward(&self, h: &Array, input: &Array) -> layers::Result<Array> {
        h.add(self.delta(h, input)?)
    }

    /// `norm(projection(gelu_approx(gate(h)) * input))`.
    pub(super) fn delta(&self, h: &Array, input: &Array) -> layers::Result<Array> {
        let gate = layers::gelu_approx(&self.per_layer_input_gate.forward(h)?)?;
        let gate = self.per_layer_projection.forward(&gate.multiply(input)?)?;
        self.post_per_layer_input_norm.forward(&gate)
    }

    /// Its linear layers under their checkpoint names, for layer `p` (`model.layers.N`).
    pub(super) fn linears_mut(&mut self, p: &str) -> Vec<(String, &mut layers::Linear)> {
        vec![
            (
                format!("{p}.per_layer_input_gate"),
                &mut self.per_layer_input_gate,
            ),
            (
                format!("{p}.per_layer_projection"),
                &mut self.per_layer_projection,
            ),
        ]
    }
}

/// The per-layer inputs of Gemma 4's small models: `(projection + embedding) * 2^-0.5`, where
/// the embedding is the token's row of `embed_tokens_per_layer` times `sqrt(width)` and the
/// projection is the scaled embeddings through `per_layer_model_projection`, times
/// `hidden^-0.5`, RMS-normalised per layer. Gemma 3n's table has fewer rows than the
/// vocabulary (`vocab`): a token past them reads row 0.
pub(super) struct PerLayerInputs {
    embed_tokens_per_layer: layers::Embedding,
    per_layer_model_projection: layers::Linear,
    per_layer_projection_norm: layers::RmsNorm,
    layers: i32,
    width: i32,
    hidden: i32,
    vocab: Option<i32>,
}

impl PerLayerInputs {
    /// `layers` layers of `width` features each over a hidden state of `hidden`.
    pub(super) fn load(
        weights: &mut Weights,
        (layers, width, hidden): (usize, i32, i32),
        eps: f32,
        vocab: Option<i32>,
    ) -> Result<Self, EngineError> {
        let embed_tokens_per_layer = weights.embedding("model.embed_tokens_per_layer")?;
        // A token's row is read by id: a table narrower than its layers' inputs, or (where the
        // family bounds the ids: Gemma 3n) of another height, must fail here, not gather out of
        // bounds later.
        let (rows, columns) = embed_tokens_per_layer.table.dims();
        let wide = layers as i64 * width as i64;
        if columns as i64 != wide || vocab.is_some_and(|v| v != rows) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "model.embed_tokens_per_layer is ({rows}, {columns}), but config.json asks \
                     for {} rows of {layers} layers x {width} features",
                    vocab.map_or("its".to_owned(), |v| v.to_string())
                ),
            ));
        }
        Ok(Self {
            embed_tokens_per_layer,
            per_layer_model_projection: weights.linear("model.per_layer_model_projection")?,
            per_layer_projection_norm: weights.rms_norm("model.per_layer_projection_norm", eps)?,
            layers: layers as i32,
            width,
            hidden,
            vocab,
        })
    }

    /// The inputs of every layer for token ids `tokens` (needed: the rows are read by id)
    /// whose scaled embeddings are `h`.
    pub(super) fn forward(&self, tokens: Option<&Array>, h: &Array) -> layers::Result<Array> {
        let tokens = tokens.ok_or_else(|| {
            mlx_rs::error::Exception::custom(
                "per-layer inputs are read by token id; this model takes no input embeddings",
            )
        })?;
        let (b, l) = (h.dim(0), h.dim(1));
        let shape = [b, l, self.layers, self.width];
        let tokens = match self.vocab {
            Some(rows) => {
                let inside = tokens.lt(Array::from_int(rows))?;
                mlx_rs::ops::select(&inside, tokens, mlx_rs::ops::zeros_like(tokens)?)?
            }
            None => tokens.clone(),
        };
        let rows = self.embed_tokens_per_layer.forward(&tokens)?;
        let rows = rows.multiply(scalar_like((self.width as f64).sqrt() as f32, &rows)?)?;
        let proj = self.per_layer_model_projection.forward(h)?;
        let proj = proj.multiply(scalar_like((self.hidden as f64).powf(-0.5) as f32, &proj)?)?;
        let proj = self
            .per_layer_projection_norm
            .forward(&proj.reshape(&shape)?)?;
        let sum = proj.add(rows.reshape(&shape)?)?;
        sum.multiply(scalar_like(2f64.powf(-0.5) as f32, &sum)?)
    }

    /// The embedding table and the projection under their checkpoint names.
    pub(super) fn linears_mut(&mut self) -> Vec<(String, &mut layers::Linear)> {
        vec![
            (
                "model.embed_tokens_per_layer".to_owned(),
                &mut self.embed_tokens_per_layer.table,
            ),
            (
                "model.per_layer_model_projection".to_owned(),
                &mut self.per_layer_model_projection,
            ),
        ]
    }
}

impl Family for Gemma4 {
    /// `h * hidden_size**0.5`: a Python float, so in `h`'s dtype.
    fn scale_embeddings(&self, h: Array) -> layers::Result<Array> {
        h.multiply(scalar_like(self.embed_scale, &h)?)
    }

    /// `tanh(x / cap) * cap`, the cap in the logits' dtype.
    fn logits(&self, logits: Array) -> layers::Result<Array> {
        layers::soft_cap(logits, self.softcap)
    }

    fn per_layer_inputs(&self, tokens: Option<&Array>, h: &Array) -> layers::Result<Option<Array>> {
        let Some(per_layer) = &self.per_layer else {
            return Ok(None);
        };
        per_layer.forward(tokens, h).map(Some)
    }

    fn has_per_layer_inputs(&self) -> bool {
        self.per_layer.is_some()
    }

    fn load_layer(
        &mut self,
        weights: &mut Weights,
        index: usize,
        p: &str,
    ) -> Result<(), EngineError> {
        let gate = match self.per_layer {
            Some(_) => Some(PerLayerGate::load(weights, p, self.rms_norm_eps)?),
            None => None,
        };
        let layer_scalar = weights.take(&format!("{p}.layer_scalar"))?;
        self.finish
            .insert(index, LayerFinish { gate, layer_scalar });
        Ok(())
    }

    fn finish_layer(
        &self,
        index: usize,
        out: Array,
        input: Option<&Array>,
    ) -> layers::Result<Array> {
        let Some(finish) = self.finish.get(&index) else {
            return Err(mlx_rs::error::Exception::custom(format!(
                "Gemma 4 layer {index} was not loaded on this rank"
            )));
        };
        let out = match (&finish.gate, input) {
            (Some(gate), Some(input)) => gate.forward(&out, input)?,
            _ => out,
        };
        out.multiply(&finish.layer_scalar)
    }

    fn linears_mut(&mut self) -> Vec<(String, &mut layers::Linear)> {
        let gates = (self.finish.iter_mut()).flat_map(|(i, f)| match &mut f.gate {
            Some(g) => g.linears_mut(&format!("model.layers.{i}")),
            None => Vec::new(),
        });
        let mut out: Vec<(String, &mut layers::Linear)> = gates.collect();
        out.extend(match &mut self.per_layer {
            Some(p) => p.linears_mut(),
            None => Vec::new(),
        });
        out
    }
}

/// mlx-lm's gemma4_text `ModelArgs`; a missing field takes its default there ([`Default`]:
/// Gemma 4 E2B's sizes).
#[derive(Debug, Deserialize)]
#[serde(default)]
struct Args {
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    head_dim: i32,
    global_head_dim: Option<i32>,
    rms_norm_eps: f32,
    num_key_value_heads: i32,
    num_global_key_value_heads: Option<i32>,
    num_kv_shared_layers: Option<i64>,
    hidden_size_per_layer_input: Option<i64>,
    rope_traditional: bool,
    rope_parameters: Option<Value>,
    sliding_window: i32,
    sliding_window_pattern: i64,
    max_position_embeddings: usize,
    attention_k_eq_v: bool,
    final_logit_softcapping: Option<f64>,
    enable_moe_block: bool,
    num_experts: Option<i32>,
    top_k_experts: Option<i32>,
    layer_types: Option<Vec<String>>,
    tie_word_embeddings: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            hidden_size: 1536,
            num_hidden_layers: 35,
            num_attention_heads: 8,
            head_dim: 256,
            global_head_dim: Some(512),
            rms_norm_eps: 1e-6,
            num_key_value_heads: 1,
            num_global_key_value_heads: None,
            num_kv_shared_layers: Some(20),
            hidden_size_per_layer_input: Some(256),
            rope_traditional: false,
            rope_parameters: None,
            sliding_window: 512,
            sliding_window_pattern: 5,
            max_position_embeddings: 131072,
            attention_k_eq_v: false,
            final_logit_softcapping: Some(30.0),
            enable_moe_block: false,
            num_experts: None,
            top_k_experts: None,
            layer_types: None,
            tie_word_embeddings: true,
        }
    }
}

/// mlx-lm's RoPE parameters when config.json gives none.
fn default_rope_parameters() -> Value {
    json!({
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {
            "partial_rotary_factor": 1.0,
            "rope_theta": 10000.0,
            "rope_type": "default",
        },
    })
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<Gemma4>, EngineError> {
    let args: Args = parse_args(config)?;
    let mlp = match args.enable_moe_block {
        true => MlpSpec::DenseAndMoe(experts(&args)?),
        false => MlpSpec::Dense,
    };
    let per_layer_width = args.hidden_size_per_layer_input.unwrap_or(0) as i32;
    let rope_parameters = args
        .rope_parameters
        .clone()
        .unwrap_or_else(default_rope_parameters);
    let sliding_layers = sliding_layers(&args)?;
    let kv_from = kv_sources("gemma4_text", args.num_kv_shared_layers, &sliding_layers)?;
    let mut layers = Vec::with_capacity(args.num_hidden_layers);
    for (sliding, kv_from) in sliding_layers.into_iter().zip(kv_from) {
        let kind = if sliding {
            "sliding_attention"
        } else {
            "full_attention"
        };
        let head_dim = match args.global_head_dim {
            Some(d) if d != 0 && !sliding => d,
            _ => args.head_dim,
        };
        let values_from_keys = args.attention_k_eq_v && !sliding;
        let kv_heads = match args.num_global_key_value_heads {
            Some(n) if values_from_keys => n,
            _ => args.num_key_value_heads,
        };
        let empty = json!({});
        let params = rope_parameters.get(kind).unwrap_or(&empty);
        let theta = params
            .get("rope_theta")
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        let max_pos = Some(args.max_position_embeddings);
        let rope = rope_from_config(
            head_dim,
            theta as f32,
            args.rope_traditional,
            Some(params),
            max_pos,
        )?;
        let shape = AttentionShape {
            window: sliding.then_some(args.sliding_window),
            ..AttentionShape::new(args.num_attention_heads, kv_heads, head_dim, 1.0)
        };
        layers.push(LayerSpec {
            qk_norm: Some(QkNormOver::Head),
            norms: NormLayout::Sandwich,
            activation: Activation::GeluApprox,
            values_from_keys,
            v_norm: true,
            kv_from,
            mlp: mlp.clone(),
            ..LayerSpec::llama(args.rms_norm_eps, shape, rope)
        });
    }
    split_fused_experts(&mut weights, FusedExperts::Rows, |layer| {
        format!("{layer}.experts.switch_glu")
    })?;
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: args.rms_norm_eps,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    let per_layer = match per_layer_width {
        0 => None,
        width => {
            let sizes = (args.num_hidden_layers, width, args.hidden_size);
            Some(PerLayerInputs::load(
                &mut weights,
                sizes,
                args.rms_norm_eps,
                None,
            )?)
        }
    };
    let family = Gemma4 {
        embed_scale: (args.hidden_size as f64).sqrt() as f32,
        softcap: args.final_logit_softcapping.map(|c| c as f32),
        per_layer,
        rms_norm_eps: args.rms_norm_eps,
        finish: BTreeMap::new(),
    };
    Decoder::load(weights, spec, family)
}

/// The experts of the MoE model: `router` and `experts.switch_glu` under the block, GeGLU.
fn experts(args: &Args) -> Result<MoeSpec, EngineError> {
    let need = |field: &str| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("config.json: gemma4_text with `enable_moe_block` needs `{field}`"),
        )
    };
    Ok(MoeSpec {
        name: "experts",
        router: "router.proj",
        stacked: "experts.switch_glu",
        activation: Activation::GeluApprox,
        ..MoeSpec::switch_glu(
            "experts",
            args.num_experts.ok_or_else(|| need("num_experts"))?,
            args.top_k_experts.ok_or_else(|| need("top_k_experts"))?,
            Routing::ScaledNormTopK {
                rms_norm_eps: args.rms_norm_eps,
            },
            PROJECTIONS,
        )
    })
}

/// For each layer, the earlier layer whose keys and values it attends to (`None`: its own):
/// the last `num_kv_shared_layers` layers take those of the last layer of their kind before them.
/// `family` names the model type in errors.
pub(super) fn kv_sources(
    family: &str,
    shared: Option<i64>,
    sliding: &[bool],
) -> Result<Vec<Option<usize>>, EngineError> {
    let n = sliding.len();
    let shared = shared.unwrap_or(0).max(0) as usize;
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    if shared == 0 {
        return Ok(vec![None; n]);
    }
    if shared >= n {
        return Err(invalid(format!(
            "config.json: {family} `num_kv_shared_layers` is {shared} but there are {n} layers; \
             at least one must have its own keys and values"
        )));
    }
    let first_shared = n - shared;
    (0..n)
        .map(|j| {
            if j < first_shared {
                return Ok(None);
            }
            let source = (0..first_shared).rev().find(|&i| sliding[i] == sliding[j]);
            source.map(Some).ok_or_else(|| {
                invalid(format!(
                    "config.json: {family} layer {j} shares keys and values, but no layer of \
                     its kind before layer {first_shared} has its own"
                ))
            })
        })
        .collect()
}

/// Whether each layer is a sliding-window one: from `layer_types`, else every
/// `sliding_window_pattern`-th layer is full attention (mlx-lm's tiling of the pattern).
fn sliding_layers(args: &Args) -> Result<Vec<bool>, EngineError> {
    let n = args.num_hidden_layers;
    match &args.layer_types {
        Some(types) => sliding_of("gemma4_text", types, n),
        None => {
            let p = args.sliding_window_pattern;
            Ok((1..=n as i64).map(|i| p > 1 && i % p != 0).collect())
        }
    }
}

/// Whether each of the `n` layers `types` (config.json's `layer_types`) names is a
/// sliding-window one; `family` names the model type in errors.
pub(super) fn sliding_of(
    family: &str,
    types: &[String],
    n: usize,
) -> Result<Vec<bool>, EngineError> {
    if types.len() < n {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "config.json: {family} `layer_types` lists {} layers but \
                 `num_hidden_layers` is {n}",
                types.len()
            ),
        ));
    }
    types[..n]
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(false),
            "sliding_attention" => Ok(true),
            other => Err(EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!(
                    "{family}: layer type `{other}` (config.json `layer_types`) is not \
                     supported; full_attention and sliding_attention are"
                ),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: Value) -> Args {
        parse_args(&config).unwrap()
    }

    #[test]
    fn defaults_are_e2b_layout_with_shared_kv_from_the_last_layer_of_each_kind() {
        // mlx-lm's defaults: 35 layers, pattern 5, the last 20 sharing.
        let a = args(json!({}));
        let sliding = sliding_layers(&a).unwrap();
        assert_eq!(sliding.len(), 35);
        assert_eq!(&sliding[..5], [true, true, true, true, false]);
        let sources = kv_sources("gemma4_text", a.num_kv_shared_layers, &sliding).unwrap();
        assert!(sources[..15].iter().all(Option::is_none));
        // Layer 14 is the last full layer before 15, layer 13 the last sliding one.
        assert_eq!(sources[15], Some(13));
        assert_eq!(sources[19], Some(14));
        assert_eq!(sources[34], Some(14));
        // A missing field takes the default, an explicit null is null (no softcap).
        assert_eq!(a.final_logit_softcapping, Some(30.0));
        let uncapped = args(json!({"final_logit_softcapping": null}));
        assert_eq!(uncapped.final_logit_softcapping, None);
    }

    #[test]
    fn sharing_every_layer_or_a_kind_without_a_source_is_refused() {
        let all = args(json!({"num_hidden_layers": 4, "num_kv_shared_layers": 4}));
        let sliding = sliding_layers(&all).unwrap();
        assert!(kv_sources("gemma4_text", all.num_kv_shared_layers, &sliding).is_err());
        // Layers 0-1 are sliding, 2 and 3 share; layer 3 is full with no full layer before.
        let config = json!({
            "num_hidden_layers": 4,
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                            "full_attention"],
        });
        let a = args(config);
        let sliding = sliding_layers(&a).unwrap();
        assert!(kv_sources("gemma4_text", a.num_kv_shared_layers, &sliding).is_err());
    }

    #[test]
    fn layer_types_must_cover_every_layer_and_be_known() {
        let short = args(json!({"num_hidden_layers": 3, "layer_types": ["full_attention"]}));
        assert!(sliding_layers(&short).is_err());
        let odd = args(json!({"num_hidden_layers": 1, "layer_types": ["chunked_attention"]}));
        match sliding_layers(&odd) {
            Err(EngineError::Load { kind, detail }) => {
                assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
                assert!(detail.contains("`chunked_attention`"), "{detail}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn logits_are_soft_capped() {
        let family = Gemma4 {
            embed_scale: 1.0,
            softcap: Some(30.0),
            per_layer: None,
            rms_norm_eps: 1e-6,
            finish: BTreeMap::new(),
        };
        let out = family
            .logits(Array::from_slice(&[0.0f32, 30.0, -300.0], &[3]))
            .unwrap();
        let got = out.as_slice::<f32>();
        let want = [0.0, 30.0 * 1f32.tanh(), -30.0 * 10f32.tanh()];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
    }
}
