//! A checkpoint's own multi-token-prediction head (`models/decoder/mtp.rs`) against mlx-vlm's
//! `qwen3_5_mtp` drafter. Here, not beside the head: a file under `models/` that imports
//! `models::build` would put itself on an import circle.

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::{
    layers::kv_cache::Caches,
    layers::weights::Weights,
    models::{build, Input},
};

fn ids(a: &Array) -> Vec<u32> {
    let a = ops::indexing::argmax_axis(a, -1, None).unwrap();
    a.flatten(None, None).unwrap().as_slice::<u32>().to_vec()
}

/// The head of the tiny-qwen3-5 fixture (made with mlx-vlm's `qwen3_5_mtp` drafter class)
/// guesses what mlx-vlm's drafter guesses beside mlx-lm's model (`mtp_reference.json`,
/// written with the fixture): at every position of the prompt shifted by the first token
/// taken, and three guesses chained on its own hidden states.
#[test]
fn guesses_what_mlx_vlms_drafter_guesses() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let read = |name: &str| -> Value {
        let text = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}: rebuild the fixture (delete it)"));
        serde_json::from_str(&text).unwrap()
    };
    let (config, reference) = (read("config.json"), read("mtp_reference.json"));
    let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
    assert_eq!(model.mtp_depth(), 1);
    let list = |key: &str| -> Vec<u32> {
        let values = reference[key].as_array().unwrap();
        values.iter().map(|v| v.as_u64().unwrap() as u32).collect()
    };
    let prompt = list("prompt");
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    let mut caches = model.make_caches();
    let (logits, hidden) = (model)
        .forward_with_hidden(Input::tokens(&input), Caches::One(&mut caches))
        .unwrap();
    let first = *ids(&logits).last().unwrap();
    assert_eq!(first, reference["first"].as_u64().unwrap() as u32);

    let shifted = [&prompt[1..], &[first]].concat();
    let shifted = Array::from_slice(&shifted, &[1, prompt.len() as i32]);
    let mut head = model.mtp_caches();
    let (guessed, own) = model.mtp_forward(&shifted, &hidden, &mut head).unwrap();
    assert_eq!(ids(&guessed), list("guesses"));

    let last = Array::from_int(own.dim(1) - 1);
    let mut token = Array::from_slice(&[*list("guesses").last().unwrap()], &[1, 1]);
    let mut h = own.take_axis(&last, 1).unwrap().expand_dims(1).unwrap();
    let mut chained = Vec::new();
    for _ in 0..list("chained").len() {
        let (logits, next) = model.mtp_forward(&token, &h, &mut head).unwrap();
        chained.push(ids(&logits)[0]);
        token = Array::from_slice(&[chained[chained.len() - 1]], &[1, 1]);
        h = next;
    }
    assert_eq!(chained, list("chained"));
}
