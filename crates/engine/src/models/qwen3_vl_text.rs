//! The language model of Qwen3-VL (mlx-vlm 0.7.0's `qwen3_vl` `LanguageModel`): Qwen3's layers
//! (no biases, an RMS norm over each query and key head, `head_dim` from the config) with
//! interleaved multimodal RoPE (`rope.rs` [`MRope`], [`MropeStyle::Interleaved`]) over
//! `rope_scaling.mrope_section` (default `[24, 20, 20]`), and the head untied unless
//! `tie_word_embeddings` says so. Built only under a vision model (`vision/qwen_vl.rs` names it
//! `qwen3_vl_text`, as transformers 5 names the text config), which gives the positions and
//! the deepstack rows. Qwen3-VL-MoE's (`qwen3_vl_moe_text`, mlx-vlm's `qwen3_vl_moe`) is the
//! same with Qwen3-MoE's experts (`models/qwen3_moe.rs`'s routing) in every
//! `decoder_sparse_step`-th layer not in `mlp_only_layers`.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::moe::MoeSpec,
    layers::mrope::{mrope_section, MRope, MropeStyle},
    layers::weights::Weights,
    layers::{QkNormOver, Rope},
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama},
        model::parse_args,
        qwen3_moe::split_vl_experts,
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

/// mlx-vlm's qwen3_vl_moe `TextConfig`'s experts (required there but `norm_topk_prob`).
#[derive(Debug, Deserialize)]
struct MoeArgs {
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: usize,
    mlp_only_layers: Vec<usize>,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
}

fn yes() -> bool {
    true
}

/// Qwen3-VL's language model; with `moe`, Qwen3-VL-MoE's.
pub fn load(config: &Value, mut weights: Weights, moe: bool) -> Result<Decoder, EngineError> {
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
    let tie = args.tie_word_embeddings;
    let mut spec = DecoderSpec::uniform(layer, c.num_hidden_layers, tie, max_pos);
    if moe {
        let m: MoeArgs = parse_args(config)?;
        let experts = MoeSpec::qwen3(
            m.num_experts,
            m.num_experts_per_tok,
            m.norm_topk_prob,
            false,
        );
        spec.make_sparse(&experts, m.decoder_sparse_step, &m.mlp_only_layers);
        split_vl_experts(&mut weights)?;
    }
    sanitize(&mut weights, tie);
    Ok(Decoder::load(weights, spec, Llama)?.with_mrope(mrope))
}
