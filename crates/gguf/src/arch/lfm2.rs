//! LFM2 (`general.architecture = lfm2`): `Lfm2ForCausalLM` in Hugging Face terms.
//!
//! Gated short convolutions and, in the layers whose `attention.head_count_kv` entry (a list,
//! one per layer) is not 0, attention with per-head q/k norms; every layer pre-normed with a
//! SwiGLU MLP. llama.cpp's converter stores the convolution squeezed to `(channels, kernel)`
//! (written back as Hugging Face's `(channels, 1, kernel)`), the final norm as
//! `token_embd_norm` (LFM2's `embedding_norm`), the MLP width already adjusted
//! (`feed_forward_length`), q/k rows in the Hugging Face order (NeoX-style RoPE), and ties the
//! head to the embedding.

use serde_json::{json, Map, Value};

use super::{object, BlockTable, Hyperparameters, TensorTarget, Transform};

/// Every layer's norms and MLP, under LFM2's names.
const SHARED: [(&str, &str); 5] = [
    ("attn_norm.weight", "operator_norm.weight"),
    ("ffn_norm.weight", "ffn_norm.weight"),
    ("ffn_gate.weight", "feed_forward.w1.weight"),
    ("ffn_up.weight", "feed_forward.w3.weight"),
    ("ffn_down.weight", "feed_forward.w2.weight"),
];

/// A convolution layer's.
const CONV: [(&str, &str); 3] = [
    ("shortconv.conv.weight", "conv.conv.weight"),
    ("shortconv.in_proj.weight", "conv.in_proj.weight"),
    ("shortconv.out_proj.weight", "conv.out_proj.weight"),
];

/// An attention layer's.
const ATTENTION: [(&str, &str); 6] = [
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.out_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_layernorm.weight"),
    ("attn_k_norm.weight", "self_attn.k_layernorm.weight"),
];

/// The top-level tensors, by GGUF name.
const TOP_LEVEL: [(&str, &str); 2] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("token_embd_norm.weight", "model.embedding_norm.weight"),
];

/// Whether layer `layer` attends (its KV head count is not 0).
fn attends(hp: &Hyperparameters, layer: usize) -> bool {
    hp.kv_heads_per_layer
        .as_ref()
        .is_some_and(|per_layer| per_layer.get(layer).is_some_and(|&n| n > 0))
}

fn layer_tables(hp: &Hyperparameters, layer: usize) -> [&'static BlockTable; 2] {
    match attends(hp, layer) {
        true => [&SHARED, &ATTENTION],
        false => [&SHARED, &CONV],
    }
}

pub(super) fn config(hp: &Hyperparameters) -> Map<String, Value> {
    let attention: Vec<usize> = (0..hp.num_layers).filter(|&l| attends(hp, l)).collect();
    let layer_types: Vec<&str> = (0..hp.num_layers)
        .map(|l| match attends(hp, l) {
            true => "full_attention",
            false => "conv",
        })
        .collect();
    object(json!({
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "hidden_size": hp.hidden_size,
        "num_hidden_layers": hp.num_layers,
        "num_attention_heads": hp.num_heads,
        "num_key_value_heads": hp.num_kv_heads,
        "norm_eps": hp.rms_norm_eps,
        "rope_theta": hp.rope_theta,
        "max_position_embeddings": hp.context_length,
        "conv_L_cache": hp.short_conv_cache,
        "conv_bias": false,
        "full_attn_idxs": attention,
        "layer_types": layer_types,
        // mlx-lm's `ModelArgs` requires the block fields; with no adjustment only
        // `block_ff_dim` counts.
        "block_dim": hp.hidden_size,
        "block_ff_dim": hp.intermediate_size,
        "block_auto_adjust_ff_dim": false,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
    }))
}

pub(super) fn target(gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
    let top = TOP_LEVEL.iter().find(|(g, _)| *g == gguf_name);
    let (hf_name, suffix) = match top {
        Some((_, hf)) => ((*hf).to_owned(), gguf_name),
        None => {
            let (layer, suffix) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
            let layer: usize = layer.parse().ok().filter(|&l| l < hp.num_layers)?;
            let tables = layer_tables(hp, layer);
            let (_, hf) = tables
                .iter()
                .flat_map(|t| t.iter())
                .find(|(g, _)| *g == suffix)?;
            (format!("model.layers.{layer}.{hf}"), suffix)
        }
    };
    let transform = match suffix {
        "shortconv.conv.weight" => Transform::AddChannelAxis,
        _ => Transform::None,
    };
    Some(TensorTarget { hf_name, transform })
}

pub(super) fn required_tensors(hp: &Hyperparameters) -> Vec<String> {
    let mut names: Vec<String> = TOP_LEVEL.iter().map(|(_, hf)| (*hf).to_owned()).collect();
    for layer in 0..hp.num_layers {
        for (_, hf) in layer_tables(hp, layer).iter().flat_map(|t| t.iter()) {
            names.push(format!("model.layers.{layer}.{hf}"));
        }
    }
    names
}
