//! OLMo 2: the Llama layers with the norms moved after the sublayers (each output is
//! normalised before its residual add, nothing before attention or the MLP), and RMS norms
//! over the whole query and key projections (all heads at once) before RoPE.

use serde_json::Value;

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{Decoder, LayerSpec, LlamaArgs, NormLayout},
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` for OLMo 2 are Llama's, defaults included.
pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: LlamaArgs = parse_args(config)?;
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Projection),
        norms: NormLayout::PostNorm,
        ..args.layer()?
    };
    args.load_uniform(weights, layer)
}
