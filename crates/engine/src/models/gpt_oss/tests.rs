//! OpenAI's expert layout taken apart as mlx-lm's `sanitize` does, and what GPT-OSS refuses.

use std::collections::HashMap;

use mlx_rs::Array;
use serde_json::json;

use super::sanitize;
use crate::{
    error::LoadErrorKind,
    layers::{kv_cache::Caches, weights::Weights},
    models::{tests::refusal_with, Input},
};
use fixtures::mlx_test_lock;

const P: &str = "model.layers.0.mlp.experts";

fn values(a: &Array) -> Vec<u32> {
    a.as_dtype(mlx_rs::Dtype::Uint32)
        .unwrap()
        .as_slice::<u32>()
        .to_vec()
}

#[test]
fn openai_experts_are_split_into_gate_and_up_and_packed_as_words() {
    let _lock = mlx_test_lock();
    // One expert, 2 intermediate rows (4 interleaved: gate 0, up 0, gate 1, up 1), one group of
    // 32 inputs: 16 bytes per row.
    let blocks: Vec<u8> = (0..4 * 16).map(|i| i as u8).collect();
    let tensors = HashMap::from([
        (
            format!("{P}.gate_up_proj_blocks"),
            Array::from_slice(&blocks, &[1, 4, 1, 16]),
        ),
        (
            format!("{P}.gate_up_proj_scales"),
            Array::from_slice(&[10u8, 11, 12, 13], &[1, 4, 1]),
        ),
        (
            format!("{P}.gate_up_proj_bias"),
            Array::from_slice(&[0f32, 1., 2., 3.], &[1, 4]),
        ),
        (
            format!("{P}.down_proj_blocks"),
            Array::from_slice(&blocks[..32], &[1, 2, 1, 16]),
        ),
        (
            format!("{P}.down_proj_scales"),
            Array::from_slice(&[7u8, 8], &[1, 2, 1]),
        ),
        (
            format!("{P}.down_proj_bias"),
            Array::from_slice(&[5f32, 6.], &[1, 2]),
        ),
    ]);
    let mut weights = Weights::from_tensors(tensors, &json!({}));
    sanitize(&mut weights).unwrap();
    let mut take = |name: &str| weights.take(&format!("{P}.{name}")).unwrap();

    let gate = take("gate_proj.weight");
    assert_eq!(gate.shape(), [1, 2, 4]);
    assert_eq!(gate.dtype(), mlx_rs::Dtype::Uint32);
    // Little-endian words of rows 0 and 2.
    let word =
        |row: u32, k: u32| u32::from_le_bytes([0, 1, 2, 3].map(|b| (row * 16 + k * 4 + b) as u8));
    let expected: Vec<u32> = [0, 2]
        .iter()
        .flat_map(|&r| (0..4).map(move |k| word(r, k)))
        .collect();
    assert_eq!(values(&gate), expected);
    assert_eq!(take("up_proj.weight").shape(), [1, 2, 4]);
    assert_eq!(values(&take("gate_proj.scales")), [10, 12]);
    assert_eq!(values(&take("up_proj.scales")), [11, 13]);
    assert_eq!(take("gate_proj.bias").as_slice::<f32>(), [0., 2.]);
    assert_eq!(take("up_proj.bias").as_slice::<f32>(), [1., 3.]);
    assert_eq!(take("down_proj.weight").shape(), [1, 2, 4]);
    assert_eq!(values(&take("down_proj.scales")), [7, 8]);
    assert_eq!(take("down_proj.bias").as_slice::<f32>(), [5., 6.]);
    assert_eq!(
        weights.names().count(),
        0,
        "every OpenAI tensor is replaced"
    );
}

fn config() -> serde_json::Value {
    json!({
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
    })
}

#[test]
fn a_swiglu_limit_mlx_lm_ignores_is_refused() {
    let _lock = mlx_test_lock();
    let mut config = config();
    config["swiglu_limit"] = json!(5.0);
    let (kind, detail) = refusal_with(config, HashMap::new());
    assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
    assert!(
        detail.contains("swiglu_limit") && detail.contains("7"),
        "{detail}"
    );
}

#[test]
fn dense_experts_in_transformers_layout_are_refused_by_name() {
    let _lock = mlx_test_lock();
    let dense = Array::from_slice(&[0f32; 4 * 64 * 128], &[4, 64, 128]);
    let (kind, detail) = refusal_with(
        config(),
        HashMap::from([(format!("{P}.gate_up_proj"), dense)]),
    );
    assert_eq!(kind, LoadErrorKind::UnsupportedArchitecture);
    assert!(detail.contains("gate_up_proj"), "{detail}");
}

#[test]
fn layer_types_must_name_every_layer() {
    let _lock = mlx_test_lock();
    let mut config = config();
    config["layer_types"] = json!(["sliding_attention", "full_attention"]);
    let (kind, detail) = refusal_with(config, HashMap::new());
    assert_eq!(kind, LoadErrorKind::InvalidWeights);
    assert!(detail.contains("layer_types"), "{detail}");
}

#[test]
fn openai_blocks_count_two_parameters_a_byte_and_their_scales_none() {
    let _lock = mlx_test_lock();
    let tensors = HashMap::from([
        (
            format!("{P}.gate_up_proj_blocks"),
            Array::from_slice(&[0u8; 64], &[1, 4, 1, 16]),
        ),
        (
            format!("{P}.gate_up_proj_scales"),
            Array::from_slice(&[0u8; 4], &[1, 4, 1]),
        ),
        (
            format!("{P}.gate_up_proj_bias"),
            Array::from_slice(&[0f32; 4], &[1, 4]),
        ),
    ]);
    let weights = Weights::from_tensors(tensors, &json!({}));
    assert_eq!(weights.num_parameters(), 4 * 32 + 4);
}

/// A tiny random GPT-OSS in mlx-lm's layout: 2 layers (sliding window 4, then full), 4 experts.
fn tiny_model() -> Box<dyn crate::models::model::LanguageModel> {
    let random = |shape: &[i32]| mlx_rs::random::uniform::<_, f32>(-0.5, 0.5, shape, None).unwrap();
    let mut t = HashMap::new();
    for (name, shape) in [
        ("model.embed_tokens.weight", &[128, 64][..]),
        ("lm_head.weight", &[128, 64]),
        ("model.norm.weight", &[64]),
    ] {
        t.insert(name.to_string(), random(shape));
    }
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("input_layernorm.weight", &[64][..]),
            ("post_attention_layernorm.weight", &[64]),
            ("self_attn.q_proj.weight", &[128, 64]),
            ("self_attn.q_proj.bias", &[128]),
            ("self_attn.k_proj.weight", &[64, 64]),
            ("self_attn.k_proj.bias", &[64]),
            ("self_attn.v_proj.weight", &[64, 64]),
            ("self_attn.v_proj.bias", &[64]),
            ("self_attn.o_proj.weight", &[64, 128]),
            ("self_attn.o_proj.bias", &[64]),
            ("self_attn.sinks", &[4]),
            ("mlp.router.weight", &[4, 64]),
            ("mlp.router.bias", &[4]),
        ] {
            t.insert(format!("{p}.{name}"), random(shape));
        }
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            t.insert(
                format!("{p}.mlp.experts.{proj}.weight"),
                random(&[4, 64, 64]),
            );
            t.insert(format!("{p}.mlp.experts.{proj}.bias"), random(&[4, 64]));
        }
    }
    let mut config = config();
    config["num_hidden_layers"] = json!(2);
    config["head_dim"] = json!(32);
    config["intermediate_size"] = json!(64);
    config["num_local_experts"] = json!(4);
    config["num_experts_per_tok"] = json!(2);
    config["sliding_window"] = json!(4);
    config["vocab_size"] = json!(128);
    crate::models::build(&config, Weights::from_tensors(t, &config)).unwrap()
}

#[test]
fn layers_alternate_sliding_and_full_and_the_sinks_decline_kv_bits() {
    let _lock = mlx_test_lock();
    let model = tiny_model();
    let mut caches = model.make_caches();
    assert!(matches!(
        caches[0],
        crate::layers::kv_cache::KvCache::Rotating(_)
    ));
    assert!(matches!(
        caches[1],
        crate::layers::kv_cache::KvCache::Standard(_)
    ));
    let reason = model
        .facts()
        .kv_bits_refusal
        .expect("sinks decline kv_bits");
    assert!(reason.contains("sinks"), "{reason}");
    // Past the window: the ring wraps and every position still gives logits.
    let ids = Array::from_slice(&[1i32, 2, 3, 4, 5, 6, 7], &[1, 7]);
    let logits = model
        .forward(Input::tokens(&ids), Caches::One(&mut caches))
        .unwrap();
    assert_eq!(logits.shape(), [1, 7, 128]);
    let next = Array::from_slice(&[8i32], &[1, 1]);
    let next = model
        .forward(Input::tokens(&next), Caches::One(&mut caches))
        .unwrap();
    assert_eq!(next.shape(), [1, 1, 128]);
    assert_eq!(caches[1].offset(), 8);
}
