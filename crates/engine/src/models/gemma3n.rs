//! Gemma 3n (text), as mlx-lm's gemma3n.py runs it: Gemma 4's small-model layers (plain RMS
//! norms, q/k norms and a scale-free value norm, unscaled scores, GeGLU, embeddings scaled by
//! `sqrt(hidden)`, per-layer inputs, the last `num_kv_shared_layers` layers attending to an
//! earlier layer's keys and values, soft-capped logits) with three more parts:
//!
//! - **AltUp**: the layers carry `altup_num_inputs` streams of the hidden state `(n, B, L,
//!   hidden)` ([`Family::widen`]: the embeddings and their `altup_projections`, each scaled to
//!   the embeddings' RMS). Before a block every stream is predicted as a mix of all of them
//!   (coefficients from a router over the active stream); the block runs on the active
//!   stream's prediction; after it each stream is corrected by the block's innovation
//!   (coefficients from the router over the block's output). The per-layer input gate, over the
//!   active stream (times `correct_output_scale`), adds to every stream but the first. At the
//!   end the other streams go through `altup_unembed_projections`, are scaled to the first's
//!   RMS and all are averaged ([`Family::narrow`]). The router and the coefficients run in
//!   float32 (the coefficients clipped to `altup_coef_clip`), as mlx-lm casts them.
//! - **LAuReL** beside attention ([`NormLayout::SandwichLaurel`]).
//! - **Sparse GeGLU** in the layers `activation_sparsity_pattern` gives a sparsity (E2B: the
//!   first 10 at 0.95, [`Activation::GeluTopK`]).
//!
//! Sliding layers rotate by `rope_local_base_freq`, full ones by `rope_theta` (plain RoPE;
//! `rope_scaling` is not read, as mlx-lm does not). The checkpoint is `gemma3n` with a
//! `text_config` and the language model under `model.language_model.`; its vision and audio
//! towers are dropped (`models::TOWERS`).

use std::collections::BTreeMap;

use mlx_rs::{ops, Array, Dtype};
use serde::Deserialize;
use serde_json::Value;

use super::gemma4_text::{kv_sources, sliding_of, PerLayerGate, PerLayerInputs};
use crate::{
    error::{EngineError, LoadErrorKind},
    layers::activation::topk_std_multiplier,
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{self, scalar_like, Activation, AttentionShape, QkNormOver},
    models::{
        decoder::{sanitize, Decoder, DecoderSpec, Family, LayerSpec, NormLayout},
        model::parse_args,
    },
};

/// mlx-lm's gemma3n `TextConfig` (every field required there, as here; `intermediate_size`,
/// per layer or one, and `laurel_rank` are read off the weights).
#[derive(Debug, Deserialize)]
struct Args {
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    head_dim: i32,
    rms_norm_eps: f32,
    num_key_value_heads: i32,
    num_kv_shared_layers: i64,
    vocab_size_per_layer_input: i32,
    sliding_window: i32,
    max_position_embeddings: usize,
    rope_local_base_freq: f32,
    rope_theta: f32,
    final_logit_softcapping: Option<f64>,
    layer_types: Vec<String>,
    activation_sparsity_pattern: Option<Vec<f64>>,
    hidden_size_per_layer_input: i32,
    altup_num_inputs: i32,
    altup_coef_clip: Option<f32>,
    altup_correct_scale: bool,
    altup_active_idx: i32,
}

/// Gemma 3n's own computations around the shared layers.
pub struct Gemma3n {
    embed_scale: f32,
    softcap: Option<f32>,
    per_layer: PerLayerInputs,
    rms_norm_eps: f32,
    hidden: i32,
    streams: i32,
    active: i32,
    coef_clip: Option<f32>,
    correct_scale: bool,
    altup_projections: Vec<layers::Linear>,
    altup_unembed_projections: Vec<layers::Linear>,
    /// Per layer, by checkpoint index.
    layers: BTreeMap<usize, AltUp>,
}

/// One layer's AltUp parts (`altup.*`) and its per-layer input gate.
struct AltUp {
    correct_output_scale: Array,
    /// Float32, clipped: `(n, n)` and `(n * n, n)`.
    correction_coefs: Array,
    prediction_coefs: Array,
    modality_router: layers::Linear,
    router_norm: layers::RmsNorm,
    gate: PerLayerGate,
}

impl Gemma3n {
    /// `tanh(router(norm(x) / hidden))` in float32: `(B, L, n)`.
    fn modalities(&self, altup: &AltUp, x: &Array) -> layers::Result<Array> {
        let normed = altup.router_norm.forward(x)?;
        let inv = (self.hidden as f64).powi(-1) as f32;
        let routed = altup
            .modality_router
            .forward(&normed.multiply(scalar_like(inv, &normed)?)?)?;
        ops::tanh(routed.as_dtype(Dtype::Float32)?)
    }

    /// Every stream predicted from all of them: `(n, B, L, hidden)` in `h`'s dtype.
    fn predict(&self, altup: &AltUp, h: &Array) -> layers::Result<Array> {
        let modalities = self.modalities(altup, &self.stream(h, self.active)?)?;
        let n = self.streams;
        let (b, l) = (modalities.dim(0), modalities.dim(1));
        let coefs = ops::matmul(&modalities, altup.prediction_coefs.t())?;
        let coefs = coefs
            .reshape(&[b, l, n, n])?
            .transpose_axes(&[0, 1, 3, 2])?;
        let up = h.as_dtype(Dtype::Float32)?;
        let predictions = ops::matmul(up.transpose_axes(&[1, 2, 3, 0])?, &coefs)?;
        let predictions = predictions.transpose_axes(&[3, 0, 1, 2])?.add(&up)?;
        predictions.as_dtype(h.dtype())
    }

    /// The predictions corrected by the block's output `activated` `(B, L, hidden)`.
    fn correct(
        &self,
        altup: &AltUp,
        predictions: &Array,
        activated: &Array,
    ) -> layers::Result<Array> {
        let modalities = self.modalities(altup, activated)?;
        let coefs = ops::matmul(&modalities, altup.correction_coefs.t())?;
        let coefs = coefs.add(Array::from_f32(1.0))?;
        let innovation = activated.subtract(self.stream(predictions, self.active)?)?;
        let coefs = ops::move_axis(&coefs, 2, 0)?.expand_dims(-1)?;
        let corrected = innovation.expand_dims(0)?.multiply(&coefs)?;
        corrected.add(predictions)?.as_dtype(activated.dtype())
    }

    /// Stream `i` of `h` `(n, B, L, hidden)`.
    fn stream(&self, h: &Array, i: i32) -> layers::Result<Array> {
        h.take_axis(Array::from_int(i), 0)
    }

    /// `x` `(k, B, L, hidden)` scaled to the RMS over features of `target` `(B, L, hidden)`.
    /// (mlx-lm divides by `maximum(rms, finfo.min)`: the most negative float, so `rms` itself.)
    fn rescaled(x: &Array, target: &Array) -> layers::Result<Array> {
        let rms = |x: &Array| -> layers::Result<Array> {
            let sq = x.power(scalar_like(2.0, x)?)?.mean_axis(-1, true)?;
            sq.power(scalar_like(0.5, &sq)?)
        };
        x.multiply(rms(target)?.divide(rms(x)?)?)
    }
}

impl Family for Gemma3n {
    /// `h * hidden_size**0.5`, in `h`'s dtype.
    fn scale_embeddings(&self, h: Array) -> layers::Result<Array> {
        h.multiply(scalar_like(self.embed_scale, &h)?)
    }

    fn logits(&self, logits: Array) -> layers::Result<Array> {
        layers::soft_cap(logits, self.softcap)
    }

    fn per_layer_inputs(&self, tokens: Option<&Array>, h: &Array) -> layers::Result<Option<Array>> {
        self.per_layer.forward(tokens, h).map(Some)
    }

    fn has_per_layer_inputs(&self) -> bool {
        true
    }

    /// The embeddings and their AltUp projections, each scaled to the embeddings' RMS.
    fn widen(&self, h: Array) -> layers::Result<Array> {
        let projected = (self.altup_projections.iter())
            .map(|p| p.forward(&h))
            .collect::<layers::Result<Vec<_>>>()?;
        let others = Self::rescaled(&ops::stack(&projected, 0)?, &h)?;
        ops::concatenate(&[h.expand_dims(0)?, others], 0)
    }

    /// The other streams through their unembedding projections, scaled to the first's RMS, and
    /// the mean of all.
    fn narrow(&self, h: Array) -> layers::Result<Array> {
        let first = self.stream(&h, 0)?;
        let others = (self.altup_unembed_projections.iter().enumerate())
            .map(|(k, p)| p.forward(&self.stream(&h, k as i32 + 1)?))
            .collect::<layers::Result<Vec<_>>>()?;
        let others = Self::rescaled(&ops::stack(&others, 0)?, &first)?;
        ops::concatenate(&[first.expand_dims(0)?, others], 0)?.mean_axis(0, false)
    }

    fn layer(
        &self,
        index: usize,
        h: &Array,
        per_layer_input: Option<&Array>,
        block: &mut dyn FnMut(&Array) -> layers::Result<Array>,
    ) -> layers::Result<Array> {
        let (Some(altup), Some(input)) = (self.layers.get(&index), per_layer_input) else {
            return Err(mlx_rs::error::Exception::custom(format!(
                "Gemma 3n layer {index} needs its AltUp parts and its per-layer input"
            )));
        };
        let predictions = self.predict(altup, h)?;
        let out = block(&self.stream(&predictions, self.active)?)?;
        let corrected = self.correct(altup, &predictions, &out)?;
        let mut first = self.stream(&corrected, self.active)?;
        if self.correct_scale {
            first = first.multiply(&altup.correct_output_scale)?;
        }
        let delta = altup.gate.delta(&first, input)?;
        let parts = ops::split_at_indices(&corrected, &[1], 0)?;
        ops::concatenate(&[parts[0].clone(), parts[1].add(&delta)?], 0)
    }

    fn load_layer(
        &mut self,
        weights: &mut Weights,
        index: usize,
        p: &str,
    ) -> Result<(), EngineError> {
        let clip = self.coef_clip;
        let mut coefs = |name: &str| -> Result<Array, EngineError> {
            let w = weights.take(&format!("{p}.altup.{name}.weight"))?;
            let w = w.as_dtype(Dtype::Float32).map_err(EngineError::from)?;
            match clip {
                Some(c) => ops::clip(&w, (Array::from_f32(-c), Array::from_f32(c)))
                    .map_err(EngineError::from),
                None => Ok(w),
            }
        };
        let correction_coefs = coefs("correction_coefs")?;
        let prediction_coefs = coefs("prediction_coefs")?;
        let n = self.streams;
        let expected = [
            ("correction_coefs", &correction_coefs, [n, n]),
            ("prediction_coefs", &prediction_coefs, [n * n, n]),
        ];
        for (name, w, shape) in expected {
            if w.shape() != shape {
                return Err(EngineError::load(
                    LoadErrorKind::InvalidWeights,
                    format!(
                        "{p}.altup.{name}.weight is {:?}, but altup_num_inputs {n} needs {shape:?}",
                        w.shape()
                    ),
                ));
            }
        }
        let modality_router = weights.linear(&format!("{p}.altup.modality_router"))?;
        if modality_router.dims() != (n, self.hidden) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "{p}.altup.modality_router is {:?}, but altup_num_inputs {n} over hidden {} \
                     needs ({n}, {})",
                    modality_router.dims(),
                    self.hidden,
                    self.hidden
                ),
            ));
        }
        let altup = AltUp {
            correct_output_scale: weights.take(&format!("{p}.altup.correct_output_scale"))?,
            correction_coefs,
            prediction_coefs,
            modality_router,
            router_norm: weights.rms_norm(&format!("{p}.altup.router_norm"), self.rms_norm_eps)?,
            gate: PerLayerGate::load(weights, p, self.rms_norm_eps)?,
        };
        self.layers.insert(index, altup);
        Ok(())
    }

    fn linears_mut(&mut self) -> Vec<(String, &mut layers::Linear)> {
        let mut out = Vec::new();
        for (i, altup) in &mut self.layers {
            let p = format!("model.layers.{i}");
            out.push((
                format!("{p}.altup.modality_router"),
                &mut altup.modality_router,
            ));
            out.extend(altup.gate.linears_mut(&p));
        }
        for (k, l) in self.altup_projections.iter_mut().enumerate() {
            out.push((format!("model.altup_projections.{k}"), l));
        }
        for (k, l) in self.altup_unembed_projections.iter_mut().enumerate() {
            out.push((format!("model.altup_unembed_projections.{k}"), l));
        }
        out.extend(self.per_layer.linears_mut());
        out
    }
}

/// A `gemma3n` checkpoint's language model (its `text_config`, as mlx-lm's `Model` reads it).
pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<Gemma3n>, EngineError> {
    let args: Args = parse_args(config)?;
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    let n = args.num_hidden_layers;
    if args.altup_num_inputs < 2 || !(0..args.altup_num_inputs).contains(&args.altup_active_idx) {
        return Err(invalid(format!(
            "config.json: gemma3n needs `altup_num_inputs` >= 2 and `altup_active_idx` among \
             them (given {} and {})",
            args.altup_num_inputs, args.altup_active_idx
        )));
    }
    let sliding = sliding_of("gemma3n", &args.layer_types, n)?;
    let kv_from = kv_sources("gemma3n", Some(args.num_kv_shared_layers), &sliding)?;
    let sparsity = args.activation_sparsity_pattern.clone().unwrap_or_default();
    // mlx-lm reads one per layer (an index past them fails there); 1 or more has no cutoff.
    let valid = |s: &f64| (0.0..1.0).contains(s);
    if args.activation_sparsity_pattern.is_some()
        && (sparsity.len() < n || !sparsity.iter().all(valid))
    {
        return Err(invalid(format!(
            "config.json: gemma3n `activation_sparsity_pattern` needs a sparsity in [0, 1) for \
             each of the {n} layers (given {sparsity:?})"
        )));
    }
    let mut layers = Vec::with_capacity(n);
    for (i, (sliding, kv_from)) in sliding.into_iter().zip(kv_from).enumerate() {
        let theta = match sliding {
            true => args.rope_local_base_freq,
            false => args.rope_theta,
        };
        let max_pos = Some(args.max_position_embeddings);
        let rope = rope_from_config(args.head_dim, theta, false, None, max_pos)?;
        let shape = AttentionShape {
            window: sliding.then_some(args.sliding_window),
            ..AttentionShape::new(
                args.num_attention_heads,
                args.num_key_value_heads,
                args.head_dim,
                1.0,
            )
        };
        let activation = match sparsity.get(i).copied().unwrap_or(0.0) {
            s if s > 0.0 => Activation::GeluTopK {
                std_multiplier: topk_std_multiplier(s).map_err(EngineError::from)?,
            },
            _ => Activation::GeluApprox,
        };
        layers.push(LayerSpec {
            qk_norm: Some(QkNormOver::Head),
            norms: NormLayout::SandwichLaurel,
            activation,
            v_norm: true,
            kv_from,
            ..LayerSpec::llama(args.rms_norm_eps, shape, rope)
        });
    }
    sanitize(&mut weights, true);
    let hidden = args.hidden_size;
    let projections = |weights: &mut Weights, name: &str| {
        (0..args.altup_num_inputs - 1)
            .map(|k| {
                let linear = weights.linear(&format!("model.{name}.{k}"))?;
                match linear.dims() == (hidden, hidden) {
                    true => Ok(linear),
                    false => Err(invalid(format!(
                        "model.{name}.{k} is {:?}, not ({hidden}, {hidden})",
                        linear.dims()
                    ))),
                }
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let family = Gemma3n {
        embed_scale: (args.hidden_size as f64).sqrt() as f32,
        softcap: args.final_logit_softcapping.map(|c| c as f32),
        per_layer: PerLayerInputs::load(
            &mut weights,
            (n, args.hidden_size_per_layer_input, args.hidden_size),
            args.rms_norm_eps,
            Some(args.vocab_size_per_layer_input),
        )?,
        rms_norm_eps: args.rms_norm_eps,
        hidden: args.hidden_size,
        streams: args.altup_num_inputs,
        active: args.altup_active_idx,
        coef_clip: args.altup_coef_clip,
        correct_scale: args.altup_correct_scale,
        altup_projections: projections(&mut weights, "altup_projections")?,
        altup_unembed_projections: projections(&mut weights, "altup_unembed_projections")?,
        layers: BTreeMap::new(),
    };
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: args.rms_norm_eps,
        tie_word_embeddings: true,
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    Decoder::load(weights, spec, family)
}
