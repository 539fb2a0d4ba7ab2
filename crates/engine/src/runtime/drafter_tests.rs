//! Drafters that read the model's hidden states, against mlx-vlm's on the tiny-qwen3-5 fixture:
//! the checkpoint's own multi-token-prediction head (`models/decoder/mtp.rs`, mlx-vlm's
//! `qwen3_5_mtp`) and a DFlash block drafter (`models/dflash.rs`, mlx-vlm's `qwen3_dflash`).
//! Here, not beside them: a file under `models/` that imports `models::build` would put itself
//! on an import circle.

use mlx_rs::{ops, Array};
use serde_json::Value;

use crate::{
    layers::kv_cache::Caches,
    layers::weights::Weights,
    models::{build, DFlash, Input, Tap},
};

fn read(dir: &std::path::Path, name: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}: rebuild the fixture (delete it)"));
    serde_json::from_str(&text).unwrap()
}

fn list(reference: &Value, key: &str) -> Vec<u32> {
    let values = reference[key].as_array().unwrap();
    values.iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

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
    let (config, reference) = (read(&dir, "config.json"), read(&dir, "mtp_reference.json"));
    let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
    assert_eq!(model.mtp_depth(), 1);
    let list = |key: &str| list(&reference, key);
    let prompt = list("prompt");
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    let mut caches = model.make_caches();
    let (logits, hidden) = (model)
        .forward_with_hidden(Input::tokens(&input), Caches::One(&mut caches), &Tap::Final)
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

/// The fixture's DFlash drafter (`dflash/`, made with mlx-vlm's `qwen3_dflash` class and saved as
/// z-lab's releases are) drafts what mlx-vlm's drafter drafts beside mlx-lm's model
/// (`dflash_reference.json`): a block after the prompt, then the model's verification of it
/// (its tokens at every position) and the next block over the verified context.
#[test]
fn dflash_drafts_what_mlx_vlms_drafter_drafts() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let (config, reference) = (
        read(&dir, "config.json"),
        read(&dir, "dflash_reference.json"),
    );
    let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
    let drafter_config = read(&dir.join("dflash"), "config.json");
    assert!(DFlash::is_dflash(&drafter_config));
    let weights = Weights::load_dir(&dir.join("dflash"), &drafter_config).unwrap();
    let facts = model.facts();
    let drafter = DFlash::load(&drafter_config, weights, facts.hidden_size, facts.layers).unwrap();
    let list = |key: &str| list(&reference, key);
    let tap = Tap::Layers(drafter.target_layers.clone());
    assert_eq!(
        tap,
        Tap::Layers(
            list("target_layer_ids")
                .iter()
                .map(|&i| i as usize)
                .collect()
        )
    );

    let mut caches = model.make_caches();
    let mut run = |tokens: &[u32]| {
        let input = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        (model.forward_with_hidden(Input::tokens(&input), Caches::One(&mut caches), &tap)).unwrap()
    };
    let mut drafts = drafter.caches();
    let mut draft = |last: u32, context: &Array| {
        let block: Vec<u32> = [last].into_iter().chain([drafter.mask_token; 3]).collect();
        let block = model.embed(&Array::from_slice(&block, &[1, 4])).unwrap();
        let h = drafter.forward(&block, context, &mut drafts).unwrap();
        let guesses = h.take_axis(Array::from_slice(&[1, 2, 3], &[3]), 1).unwrap();
        ids(&model.head_logits(&guesses).unwrap())
    };
    let (logits, context) = run(&list("prompt"));
    let first = *ids(&logits).last().unwrap();
    assert_eq!(first, reference["first"].as_u64().unwrap() as u32);
    let draft1 = draft(first, &context);
    assert_eq!(draft1, list("draft1"));

    let (logits, verified) = run(&[&[first][..], &draft1].concat());
    let target1 = ids(&logits);
    assert_eq!(target1, list("target1"));
    let accepted = draft1
        .iter()
        .zip(&target1)
        .take_while(|(d, t)| d == t)
        .count();
    assert_eq!(accepted as u64, reference["accepted"].as_u64().unwrap());
    let rows = mlx_rs::ops::arange::<_, i32>(0, accepted as i32 + 1, 1).unwrap();
    let draft2 = draft(target1[accepted], &verified.take_axis(&rows, 1).unwrap());
    assert_eq!(draft2, list("draft2"));
}
