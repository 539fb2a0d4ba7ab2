//! OLMo 3: OLMo 2's layers (norms after the sublayers, RMS norms over the whole query and key
//! projections) with sliding-window attention in the layers `layer_types` marks (default:
//! every fourth layer full, the rest sliding). Only the full-attention layers take
//! `rope_scaling`; the sliding ones run plain RoPE, as mlx-lm's olmo3.py builds them.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{load_layers, CommonArgs, Decoder, LayerSpec, NormLayout},
        llama::layer_windows,
        model::parse_args,
    },
};

/// mlx-lm's olmo3 `ModelArgs` and its defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    /// Absent: `hidden_size / num_attention_heads`.
    head_dim: Option<i32>,
    max_position_embeddings: usize,
    sliding_window: i32,
    rope_theta: f32,
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let n = c.num_hidden_layers;
    let types = args.layer_types.clone().unwrap_or_else(|| {
        (0..n)
            .map(|i| match (i + 1) % 4 {
                0 => "full_attention".to_owned(),
                _ => "sliding_attention".to_owned(),
            })
            .collect()
    });
    let windows = layer_windows(Some(&types), Some(args.sliding_window), n, "olmo3")?;
    let head_dim = args.head_dim.unwrap_or(c.default_head_dim());
    let max_pos = Some(args.max_position_embeddings);
    let scaled = c.rope(head_dim, args.rope_theta, false, max_pos)?;
    let plain = rope_from_config(head_dim, args.rope_theta, false, None, max_pos)?;
    let layers = windows
        .into_iter()
        .map(|window| {
            let mut layer = LayerSpec {
                qk_norm: Some(QkNormOver::Projection),
                norms: NormLayout::PostNorm,
                ..c.llama_layer(
                    head_dim,
                    if window.is_some() {
                        plain.clone()
                    } else {
                        scaled.clone()
                    },
                )
            };
            layer.shape.window = window;
            layer
        })
        .collect();
    load_layers(weights, c, layers, args.tie_word_embeddings, max_pos)
}
