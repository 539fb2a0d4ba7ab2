//! EXAONE 4: norms after the sublayers (as OLMo 2), RMS norms over each head's queries and keys
//! before RoPE (as Qwen3), and, with `sliding_window_pattern` (e.g. `"LLLG"`, repeated over the
//! layers), local layers that attend within `sliding_window` with RoPE beside global layers that
//! attend to everything without positional encoding. Without a pattern every layer is global
//! with RoPE, as mlx-lm's exaone4.py builds it.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{load_layers, CommonArgs, Decoder, LayerSpec, NormLayout},
        model::parse_args,
    },
};

/// mlx-lm's exaone4 `ModelArgs`: every field required.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    max_position_embeddings: usize,
    rope_theta: f32,
    tie_word_embeddings: bool,
    sliding_window: Option<i32>,
    sliding_window_pattern: Option<String>,
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(args.head_dim, args.rope_theta, false, max_pos)?;
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Head),
        norms: NormLayout::PostNorm,
        ..c.llama_layer(args.head_dim, rope)
    };
    let pattern: Vec<char> = args
        .sliding_window_pattern
        .as_deref()
        .unwrap_or("")
        .chars()
        .collect();
    let invalid = |detail: &str| {
        Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("config.json: exaone4 {detail}"),
        ))
    };
    if pattern.iter().any(|&p| p != 'L' && p != 'G') {
        return invalid("`sliding_window_pattern` is made of `L` (local) and `G` (global)");
    }
    if !pattern.is_empty() && (!pattern.contains(&'L') || !pattern.contains(&'G')) {
        return invalid("`sliding_window_pattern` needs both an `L` and a `G` layer");
    }
    let window = match (pattern.contains(&'L'), args.sliding_window) {
        (true, Some(w)) if w > 0 => Some(w),
        (true, _) => return invalid("local (`L`) layers need a positive `sliding_window`"),
        (false, _) => None,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| match pattern.get(i % pattern.len().max(1)) {
            Some('L') => {
                let mut local = layer.clone();
                local.shape.window = window;
                local
            }
            Some(_) => LayerSpec {
                rope: None,
                ..layer.clone()
            },
            None => layer.clone(),
        })
        .collect();
    load_layers(weights, c, layers, args.tie_word_embeddings, max_pos)
}
