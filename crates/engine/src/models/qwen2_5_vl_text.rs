//! The language model of Qwen2-VL/Qwen2.5-VL (mlx-vlm 0.7.0's `qwen2_5_vl` `LanguageModel`):
//! Qwen2's layers (q/k/v biases, `head_dim = hidden / heads`) with multimodal RoPE
//! (`rope.rs` [`MRope`]) over `rope_scaling.mrope_section` (default `[24, 20, 20]`), base
//! `rope_theta` (default 1e6), the head tied unless `tie_word_embeddings` is false. Built only
//! under a vision model (`vision/qwen_vl.rs` names it `qwen2_5_vl_text`, as transformers 5
//! names the text config); the positions come from there.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::mrope::{mrope_section, MRope, MropeStyle},
    layers::weights::Weights,
    layers::Rope,
    models::{
        decoder::{load_uniform, CommonArgs, Decoder},
        model::parse_args,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default = "default_max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    1_000_000.0
}
fn default_max_position_embeddings() -> usize {
    128_000
}
fn default_true() -> bool {
    true
}

pub fn load(config: &Value, weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let head_dim = c.default_head_dim();
    let sections = mrope_section(c.rope_scaling.as_ref())?;
    let mrope = MRope::new(head_dim, args.rope_theta, &sections, MropeStyle::Chunked)?;
    // Never used: every layer rotates by `mrope`.
    let rope = Rope {
        dims: head_dim,
        traditional: false,
        base: args.rope_theta,
        scale: 1.0,
        freqs: None,
        input_scale: None,
    };
    let layer = c.llama_layer(head_dim, rope);
    let max_pos = Some(args.max_position_embeddings);
    Ok(load_uniform(weights, c, layer, args.tie_word_embeddings, max_pos)?.with_mrope(mrope))
}
