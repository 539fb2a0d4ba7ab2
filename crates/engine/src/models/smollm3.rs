//! SmolLM3: Llama, with some layers attending without RoPE (NoPE). `no_rope_layers` has one
//! entry per layer, 0 for a NoPE layer; without it, as in mlx-lm, every
//! `no_rope_layer_interval`-th layer (the 4th, 8th, ... by default) is NoPE.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    models::{
        decoder::{sanitize, Decoder, Llama},
        llama,
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` defaults (the Llama fields are read by `llama::decoder_spec`).
#[derive(Debug, Deserialize)]
struct Args {
    num_hidden_layers: usize,
    #[serde(default = "default_no_rope_layer_interval")]
    no_rope_layer_interval: i64,
    no_rope_layers: Option<Vec<i64>>,
}

fn default_no_rope_layer_interval() -> i64 {
    4
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let mut spec = llama::decoder_spec(config, "smollm3")?;
    for (layer, rope) in spec.layers.iter_mut().zip(uses_rope(&args)?) {
        if !rope {
            layer.rope = None;
        }
    }
    sanitize(&mut weights, spec.tie_word_embeddings);
    Decoder::load(weights, spec, Llama)
}

/// Whether each layer applies RoPE.
fn uses_rope(args: &Args) -> Result<Vec<bool>, EngineError> {
    let n = args.num_hidden_layers;
    let invalid = |detail: String| EngineError::load(LoadErrorKind::InvalidWeights, detail);
    match &args.no_rope_layers {
        Some(flags) if flags.len() != n => Err(invalid(format!(
            "config.json: smollm3 `no_rope_layers` lists {} layers but `num_hidden_layers` is \
             {n}",
            flags.len()
        ))),
        Some(flags) => Ok(flags.iter().map(|&f| f != 0).collect()),
        None if args.no_rope_layer_interval == 0 => Err(invalid(
            "config.json: smollm3 `no_rope_layer_interval` must not be 0 (or give \
             `no_rope_layers`)"
                .into(),
        )),
        None => {
            let every = args.no_rope_layer_interval;
            Ok((1..=n as i64).map(|i| i % every != 0).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(interval: i64, flags: Option<Vec<i64>>) -> Args {
        Args {
            num_hidden_layers: 8,
            no_rope_layer_interval: interval,
            no_rope_layers: flags,
        }
    }

    #[test]
    fn every_interval_th_layer_is_nope_by_default() {
        let rope = uses_rope(&args(4, None)).unwrap();
        assert_eq!(rope, [true, true, true, false, true, true, true, false]);
    }

    #[test]
    fn an_explicit_list_wins_and_must_cover_every_layer() {
        let flags = vec![0, 1, 1, 1, 0, 1, 1, 1];
        let rope = uses_rope(&args(4, Some(flags))).unwrap();
        assert_eq!(rope, [false, true, true, true, false, true, true, true]);
        let short = uses_rope(&args(4, Some(vec![1, 0])));
        assert!(matches!(short, Err(EngineError::Load { .. })));
        assert!(uses_rope(&args(0, None)).is_err());
    }
}
