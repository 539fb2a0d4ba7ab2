//! Llama (and the many models that share its layout: SmolLM2, TinyLlama, Llama 2/3, ...).

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    models::{
        parse_args,
        transformer::{load_uniform, CommonArgs, Decoder},
    },
    weights::Weights,
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: Option<i32>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    max_position_embeddings: Option<usize>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    /// mlx-lm gives `sliding_attention` layers a rotating cache and a windowed mask; a config
    /// without `layer_types` is all full attention, whatever `sliding_window` says.
    layer_types: Option<Vec<String>>,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_true() -> bool {
    true
}

/// Builds a Llama-layout model; `family` names the model_type in errors.
pub fn load(config: &Value, weights: Weights, family: &str) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    if let Some(t) = args
        .layer_types
        .iter()
        .flatten()
        .find(|t| *t != "full_attention")
    {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "{family}: layer type `{t}` (config.json `layer_types`) is not supported; \
                 only full_attention layers are"
            ),
        ));
    }
    let c = &args.common;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let rope = c.rope(
        head_dim,
        args.rope_theta,
        args.rope_traditional,
        args.max_position_embeddings,
    )?;
    let layer = c.llama_layer(head_dim, rope);
    load_uniform(
        weights,
        c,
        layer,
        args.tie_word_embeddings,
        args.max_position_embeddings,
    )
}
