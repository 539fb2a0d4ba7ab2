//! Ministral 3 (the text model of Mistral 3): Llama layers whose RoPE and attention
//! temperature come from `rope_parameters` (mlx-lm's ministral3.py): RoPE as its `rope_type`
//! asks (YaRN in the released models), base `rope_parameters.rope_theta`, and queries scaled
//! after RoPE by `1 + llama_4_scaling_beta * ln(1 + floor(position /
//! original_max_position_embeddings))`. Sliding-window layers as `layer_types` marks them.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{QueryTemperature, TemperatureForm},
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, Llama},
        llama::layer_windows,
        model::parse_args,
    },
};

/// mlx-lm's ministral3 `ModelArgs` and its defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    /// Absent: `hidden_size / num_attention_heads`.
    head_dim: Option<i32>,
    max_position_embeddings: Option<usize>,
    rope_parameters: Option<Value>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    layer_types: Option<Vec<String>>,
    sliding_window: Option<i32>,
}

fn default_true() -> bool {
    true
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    if weights.names().any(|n| n.ends_with("weight_scale_inv")) {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            "ministral3: FP8 weights (`weight_scale_inv`) are not supported; convert the \
             checkpoint with `mlx_lm.convert` first",
        ));
    }
    let c = &args.common;
    let params = args.rope_parameters.as_ref();
    // mlx-lm reads these three without defaults.
    let number = |key: &str| {
        params
            .and_then(|p| p.get(key))
            .and_then(Value::as_f64)
            .ok_or_else(|| {
                EngineError::load(
                    LoadErrorKind::InvalidWeights,
                    format!("config.json: ministral3 needs a number `rope_parameters.{key}`"),
                )
            })
    };
    let theta = number("rope_theta")?;
    let temperature = QueryTemperature {
        beta: number("llama_4_scaling_beta")? as f32,
        max_position_embeddings: number("original_max_position_embeddings")? as f32,
        form: TemperatureForm::Mistral,
    };
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = args.max_position_embeddings;
    let rope = rope_from_config(head_dim, theta as f32, false, params, max_pos)?;
    let mut layer = c.llama_layer(head_dim, rope);
    layer.shape.temperature = Some(temperature);
    let tie = args.tie_word_embeddings;
    let mut spec = DecoderSpec::uniform(layer, c.num_hidden_layers, tie, max_pos);
    let types = args.layer_types.as_deref();
    let windows = layer_windows(types, args.sliding_window, spec.layers.len(), "ministral3")?;
    for (layer, window) in spec.layers.iter_mut().zip(windows) {
        layer.shape.window = window;
    }
    sanitize(&mut weights, tie);
    Decoder::load(weights, spec, Llama)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rope_parameters_without_the_temperature_are_refused_by_field() {
        let config = json!({
            "model_type": "ministral3",
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0},
        });
        let weights = Weights::from_tensors(Default::default(), &config);
        match load(&config, weights) {
            Err(EngineError::Load { kind, detail }) => {
                assert_eq!(kind, LoadErrorKind::InvalidWeights);
                assert!(
                    detail.contains("rope_parameters.llama_4_scaling_beta"),
                    "{detail}"
                );
            }
            Err(other) => panic!("expected a load error, got {other:?}"),
            Ok(_) => panic!("expected a load error, got a model"),
        }
    }
}
