//! The language model of Qwen3-VL (mlx-vlm 0.7.0's `qwen3_vl` `LanguageModel`): Qwen3's layers
//! (no biases, an RMS norm over each query and key head, `head_dim` from the config) with
//! interleaved multimodal RoPE (`rope.rs` [`MRope`], [`MropeStyle::Interleaved`]) over
//! `rope_scaling.mrope_section` (default `[24, 20, 20]`), and the head untied unless
//! `tie_word_embeddings` says so. Built only under a vision model (`vision/qwen_vl.rs` names it
//! `qwen3_vl_text`, as transformers 5 names the text config), which gives the positions and
//! the deepstack rows.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::mrope::{mrope_section, MRope, MropeStyle},
    layers::weights::Weights,
    layers::{QkNormOver, Rope},
    models::{
        decoder::{load_uniform, CommonArgs, Decoder, LayerSpec},
        model::parse_args,
    },
};

/// mlx-vlm's `TextConfig`: these fields have no default there.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    rope_theta: f32,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let sections = mrope_section(c.rope_scaling.as_ref())?;
    let mrope = MRope::new(
        args.head_dim,
        args.rope_theta,
        &sections,
        MropeStyle::Interleaved,
    )?;
    // Never used: every layer rotates by `mrope`.
    let rope = Rope {
        dims: args.head_dim,
        traditional: false,
        base: args.rope_theta,
        scale: 1.0,
        freqs: None,
        input_scale: None,
    };
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Head),
        ..c.llama_layer(args.head_dim, rope)
    };
    let max_pos = Some(args.max_position_embeddings);
    Ok(load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)?.with_mrope(mrope))
}
