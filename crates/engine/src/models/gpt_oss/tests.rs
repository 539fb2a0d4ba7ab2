//! OpenAI's expert layout taken apart as mlx-lm's `sanitize` does, and what GPT-OSS refuses.

use std::collections::HashMap;

use mlx_rs::Array;
use serde_json::json;

use super::sanitize;
use crate::{error::LoadErrorKind, models::tests::refusal_with, weights::Weights};
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
