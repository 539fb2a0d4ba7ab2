//! `footprint.rs`'s prices against what MLX allocates: weights after a load and a first
//! token, the KV cache of a prompt prefilled as a generation prefills it, within 10%; for a full-attention
//! model, one with a quantized KV cache, one with sliding-window layers and a hybrid one.

use std::path::Path;

use mlx_rs::{transforms::eval, Array};

use crate::{
    layers::kv_cache::{Caches, KvCache},
    models::Input,
    runtime::engine::Engine,
    runtime::request::{GenerateRequest, LoadRequest, Prompt},
    CancelToken,
};

fn active() -> u64 {
    mlx_rs::memory::active_memory().unwrap() as u64
}

fn assert_near(what: &str, measured: u64, priced: u64) {
    let off = (measured as f64 - priced as f64).abs() / priced as f64;
    assert!(
        off < 0.10,
        "{what}: MLX holds {measured} bytes, priced {priced} ({:.1}% off)",
        off * 100.0
    );
}

/// Loads `dir`, then measures the weights (after a first token made MLX read all of them) and
/// the KV cache of a prompt of `chunks` whole prefill chunks.
fn measure(dir: &Path, kv_bits: Option<u8>, chunks: usize) {
    assert!(kv_bits.is_none_or(|b| b == 8));
    let _mlx = fixtures::mlx_test_lock();
    let mut engine = Engine::new();
    let _ = mlx_rs::memory::clear_cache();
    let before = active();
    let load = LoadRequest {
        model: dir.display().to_string(),
        kv_bits,
        ..Default::default()
    };
    engine
        .load(&load, &mut |_| {}, &CancelToken::new())
        .unwrap();
    let generate = |engine: &mut Engine, n: usize| {
        let prompt = (0..n as u32).map(|i| 10 + i % 300).collect();
        let req = GenerateRequest::greedy(Prompt::Tokens(prompt), 1);
        engine
            .generate(&req, &mut |_| {}, &CancelToken::new())
            .unwrap();
    };
    generate(&mut engine, 2);
    engine.reset(true);
    let weights = active() - before;
    let footprint = &engine.models[0].footprint;
    assert_near("weights", weights, footprint.weights);

    // The caches of a `tokens`-token prompt right after its last prefill chunk (their most),
    // filled as a generation fills them (quantized after each pass with `kv_bits`).
    let before = active();
    let model = engine.models[0].model.as_ref();
    let mut caches = model.make_caches();
    let chunk = engine.prefill_chunk();
    let tokens = chunks * chunk;
    for start in (0..tokens).step_by(chunk) {
        let n = chunk.min(tokens - start) as i32;
        let ids: Vec<i32> = (0..n).map(|i| 10 + (start as i32 + i) % 300).collect();
        let ids = Array::from_slice(&ids, &[1, n]);
        let logits = model
            .forward(Input::tokens(&ids), Caches::One(&mut caches))
            .unwrap();
        for cache in caches.iter_mut().filter(|_| kv_bits.is_some()) {
            cache.quantize(8).unwrap();
        }
        eval(caches.iter().flat_map(KvCache::arrays).chain([&logits])).unwrap();
    }
    let _ = mlx_rs::memory::clear_cache();
    let kv = active() - before;
    let priced = engine.models[0].footprint.kv_bytes(tokens as u64);
    assert_near("KV cache", kv, priced);
}

#[test]
fn smollm2s_weights_and_kv_cache_are_priced_as_held() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    measure(&dir, None, 2);
    measure(&dir, Some(8), 2);
}

#[test]
fn sliding_window_layers_are_priced_at_their_window() {
    // Gemma 3 270M: five sliding-window layers (512 positions) to each full one.
    let Some(dir) = fixtures::gemma3_dir() else {
        return;
    };
    measure(&dir, None, 3);
}

#[test]
fn recurrent_states_are_priced_once() {
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    measure(&dir, None, 2);
}
