//! Llama (and the many models that share its layout: SmolLM2, TinyLlama, Llama 2/3, ...).

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    models::{
        decoder::{sanitize, Decoder, DecoderSpec, Llama, LlamaArgs},
        model::parse_args,
    },
};

/// mlx-lm's Llama `ModelArgs`.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    llama: LlamaArgs,
    /// `full_attention` or `sliding_attention` per layer (a rotating cache of `sliding_window`
    /// positions, as in mlx-lm); without it every layer is full attention, whatever
    /// `sliding_window` says.
    layer_types: Option<Vec<String>>,
    sliding_window: Option<i32>,
}

/// Builds a Llama-layout model; `family` names the model_type in errors.
pub fn load(config: &Value, mut weights: Weights, family: &str) -> Result<Decoder, EngineError> {
    let spec = decoder_spec(config, family)?;
    sanitize(&mut weights, spec.tie_word_embeddings);
    Decoder::load(weights, spec, Llama)
}

/// The Llama layers config.json describes, for families that adjust them (SmolLM3).
pub fn decoder_spec(config: &Value, family: &str) -> Result<DecoderSpec, EngineError> {
    let args: Args = parse_args(config)?;
    let a = &args.llama;
    let n = a.common.num_hidden_layers;
    let windows = layer_windows(args.layer_types.as_deref(), args.sliding_window, n, family)?;
    let mut spec = DecoderSpec::uniform(
        a.layer()?,
        a.common.num_hidden_layers,
        a.tie_word_embeddings,
        a.max_position_embeddings,
    );
    for (layer, window) in spec.layers.iter_mut().zip(windows) {
        layer.shape.window = window;
    }
    Ok(spec)
}

/// Each of `n` layers' attention window (`None`: full attention), from `layer_types` (absent:
/// all full) and `sliding_window`.
pub fn layer_windows(
    layer_types: Option<&[String]>,
    sliding_window: Option<i32>,
    n: usize,
    family: &str,
) -> Result<Vec<Option<i32>>, EngineError> {
    let Some(types) = layer_types else {
        return Ok(vec![None; n]);
    };
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    if types.len() != n {
        return Err(invalid(format!(
            "config.json: {family} `layer_types` lists {} layers but `num_hidden_layers` is {n}",
            types.len()
        )));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(None),
            "sliding_attention" => match sliding_window {
                Some(w) if w > 0 => Ok(Some(w)),
                _ => Err(invalid(format!(
                    "config.json: {family} `sliding_attention` layers need a positive \
                     `sliding_window`"
                ))),
            },
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
