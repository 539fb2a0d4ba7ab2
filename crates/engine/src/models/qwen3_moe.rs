//! Qwen3-MoE: Qwen3's attention (q/k norms per head, `head_dim` from config.json) with a sparse
//! mixture of experts as the MLP of every `decoder_sparse_step`-th layer not in
//! `mlp_only_layers`; routing is a softmax over all experts, then the top k, renormalised when
//! `norm_topk_prob`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::EngineError,
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama},
        model::{parse_args, text_config_as},
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    rope_theta: f32,
    max_position_embeddings: usize,
    tie_word_embeddings: bool,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: usize,
    mlp_only_layers: Vec<usize>,
    norm_topk_prob: bool,
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    // mlx-lm's Qwen3-MoE runs plain RoPE whatever `rope_scaling` says.
    c.refuse_rope_scaling("qwen3_moe")?;
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(args.head_dim, args.rope_theta, false, max_pos)?;
    let layer = LayerSpec {
        qk_norm: Some(QkNormOver::Head),
        ..c.llama_layer(args.head_dim, rope)
    };
    let moe = MoeSpec::qwen3(
        args.num_experts,
        args.num_experts_per_tok,
        args.norm_topk_prob,
        false,
    );
    let n = c.num_hidden_layers;
    let mut spec = DecoderSpec::uniform(layer, n, args.tie_word_embeddings, max_pos);
    spec.make_sparse(&moe, args.decoder_sparse_step, &args.mlp_only_layers);
    sanitize(&mut weights, args.tie_word_embeddings);
    Decoder::load(weights, spec, Llama)
}

/// The `qwen3_moe` config of a Qwen3-VL-MoE checkpoint (`qwen3_vl_moe`), whose language model
/// mlx-lm's qwen3_vl_moe.py runs alone as Qwen3-MoE: `text_config`, its head tied as the
/// checkpoint says where the text config does not, and its `rope_scaling` dropped where it only
/// describes M-RoPE's sections (one position per token gives plain RoPE, which mlx-lm runs).
pub fn vl_text_config(config: &Value) -> Result<Value, EngineError> {
    let mut text = text_config_as(config, "qwen3_vl_moe", "qwen3_moe")?;
    if text.get("tie_word_embeddings").is_none() {
        text["tie_word_embeddings"] = config
            .get("tie_word_embeddings")
            .cloned()
            .unwrap_or(json!(false));
    }
    let mrope_only = text.get("rope_scaling").is_some_and(|s| {
        s.get("mrope_section").is_some()
            && s.get("rope_type")
                .and_then(Value::as_str)
                .unwrap_or("default")
                == "default"
    });
    if mrope_only {
        text["rope_scaling"] = Value::Null;
    }
    Ok(text)
}

/// A Qwen3-VL-MoE checkpoint's fused experts (`experts.gate_up_proj` `(experts, hidden, 2 *
/// moe)`, `experts.down_proj`) split into `switch_mlp`, as mlx-lm's qwen3_vl_moe.py does.
pub fn split_vl_experts(weights: &mut Weights) -> Result<(), EngineError> {
    split_fused_experts(weights, FusedExperts::Columns, |mlp| {
        format!("{mlp}.switch_mlp")
    })
}
