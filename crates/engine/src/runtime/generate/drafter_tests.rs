//! Drafters that read the model's hidden states draft what mlx-vlm's draft beside mlx-lm's
//! model on the tiny-qwen3-5 fixture (made with mlx-vlm's classes, saved as the releases are,
//! with `<kind>_reference.json`): the checkpoint's own multi-token-prediction head
//! (`models/decoder/mtp.rs`, mlx-vlm's `qwen3_5_mtp`), and through the generation's own
//! drafters the companions in `<kind>/`: the block drafters (`models/dflash.rs`: DFlash,
//! DFlash2, DSpark, through [`BlockDraft`]) and EAGLE-3 (`models/eagle3.rs`, through
//! [`ChainDraft`]): a draft after the prompt, the model's verification of it (its token at
//! every position), and the next draft after it. Here, not beside the models: a file under
//! `models/` that imports `models::build` would put itself on an import circle.

use mlx_rs::{ops, Array};
use serde_json::Value;

use super::{
    drafters::{BlockDraft, ChainDraft},
    state::HiddenSink,
};
use crate::{
    layers::kv_cache::Caches,
    layers::weights::Weights,
    models::{build, BlockKind, DFlash, Eagle3, Input, LanguageModel, Tap},
    runtime::sampler::Sampler,
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

fn greedy(logits: &Array) -> Vec<u32> {
    let a = ops::indexing::argmax_axis(logits, -1, None).unwrap();
    a.flatten(None, None).unwrap().as_slice::<u32>().to_vec()
}

/// A companion drafter as a generation drives it (the block and chain drafters' own calls).
trait Rounds {
    fn taken(&mut self, draft: &[u32], accepted: usize, next: u32, hidden: Option<&Array>);
    fn draft(&mut self, limit: usize, sampler: &mut Sampler) -> Vec<u32>;
}

impl Rounds for BlockDraft<'_> {
    fn taken(&mut self, _: &[u32], accepted: usize, next: u32, hidden: Option<&Array>) {
        BlockDraft::taken(self, accepted, next, hidden).unwrap()
    }
    fn draft(&mut self, limit: usize, sampler: &mut Sampler) -> Vec<u32> {
        BlockDraft::draft(self, limit, sampler, None).unwrap()
    }
}

impl Rounds for ChainDraft<'_> {
    fn taken(&mut self, draft: &[u32], accepted: usize, next: u32, hidden: Option<&Array>) {
        ChainDraft::taken(self, draft, accepted, next, hidden).unwrap()
    }
    fn draft(&mut self, limit: usize, sampler: &mut Sampler) -> Vec<u32> {
        ChainDraft::draft(self, limit, sampler, None).unwrap()
    }
}

/// The reference's two rounds with a drafter `make` builds over the prompt's hidden states
/// (`tap`'s): the prompt through `model`, a draft of `guesses` after its first token, the
/// model over that token and the draft, `accepted` guesses taken (the reference's, which it
/// counted or forced) and the model's token after them, the next draft.
fn two_rounds<'a, D: Rounds>(
    what: &str,
    reference: &Value,
    model: &'a dyn LanguageModel,
    tap: &Tap,
    guesses: usize,
    make: impl FnOnce(&[u32], HiddenSink) -> D,
) {
    let list = |key: &str| list(reference, key);
    let mut caches = model.make_caches();
    let mut run = |tokens: &[u32]| {
        let input = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        (model.forward_with_hidden(Input::tokens(&input), Caches::One(&mut caches), tap)).unwrap()
    };
    let prompt = list("prompt");
    let (logits, context) = run(&prompt);
    let first = *greedy(&logits).last().unwrap();
    assert_eq!(first, reference["first"].as_u64().unwrap() as u32);
    let sink = HiddenSink {
        tap: tap.clone(),
        start: 0,
        chunks: vec![context],
    };
    let mut drafter = make(&prompt, sink);
    let vocab = model.facts().embedding_rows as usize;
    let mut sampler = Sampler::new(Default::default(), vocab).unwrap();
    drafter.taken(&[], 0, first, None);
    let draft1 = drafter.draft(guesses, &mut sampler);
    assert_eq!(draft1, list("draft1"), "{what}: the first draft");

    let (logits, verified) = run(&[&[first][..], &draft1].concat());
    let target1 = greedy(&logits);
    assert_eq!(target1, list("target1"));
    let accepted = reference["accepted"].as_u64().unwrap() as usize;
    drafter.taken(&draft1, accepted, target1[accepted], Some(&verified));
    let draft2 = drafter.draft(guesses, &mut sampler);
    assert_eq!(
        draft2,
        list("draft2"),
        "{what}: the draft after {accepted} taken"
    );
}

fn drafts_what_mlx_vlm_drafts(kind: &str, expected: BlockKind) {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let config = read(&dir, "config.json");
    let reference = read(&dir, &format!("{kind}_reference.json"));
    let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
    let drafter_config = read(&dir.join(kind), "config.json");
    assert_eq!(DFlash::kind(&drafter_config), Some(expected));
    let weights = Weights::load_dir(&dir.join(kind), &drafter_config).unwrap();
    let facts = model.facts();
    let drafter = DFlash::load(&drafter_config, weights, facts.hidden_size, facts.layers).unwrap();
    let block_size = reference["block_size"].as_u64().unwrap();
    assert_eq!(drafter.block_size as u64, block_size);
    let layers = list(&reference, "target_layer_ids");
    let tap = Tap::Layers(layers.iter().map(|&i| i as usize).collect());
    assert_eq!(Tap::Layers(drafter.target_layers.clone()), tap);
    two_rounds(
        kind,
        &reference,
        &*model,
        &tap,
        drafter.block_size - 1,
        |prompt, sink| {
            BlockDraft::new(&*model, &drafter, prompt, (Some(sink), None))
                .unwrap()
                .unwrap()
        },
    );
}

#[test]
fn dflash_drafts_what_mlx_vlms_drafter_drafts() {
    drafts_what_mlx_vlm_drafts("dflash", BlockKind::Dflash);
}

/// DFlash2: its convolutions and its candidate selector (which picks other tokens than the
/// head's best on this fixture: checked when the fixture was made).
#[test]
fn dflash2_drafts_what_mlx_vlms_drafter_drafts() {
    drafts_what_mlx_vlm_drafts("dflash2", BlockKind::Dflash2);
}

/// DSpark: its Markov head, drafting from the anchor's own position.
#[test]
fn dspark_drafts_what_mlx_vlms_drafter_drafts() {
    drafts_what_mlx_vlm_drafts("dspark", BlockKind::Dspark);
}

/// EAGLE-3: its prefill over the prompt shifted by the first token, a chained draft, then
/// (told that two guesses and the model's next token were taken) its re-run of them beside the
/// verification's hidden states and the next draft. Its draft vocabulary maps into the model's.
#[test]
fn eagle3_drafts_what_mlx_vlms_drafter_drafts() {
    let _mlx = fixtures::mlx_test_lock();
    let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
        return;
    };
    let config = read(&dir, "config.json");
    let reference = read(&dir, "eagle3_reference.json");
    let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
    let drafter_config = read(&dir.join("eagle3"), "config.json");
    assert!(Eagle3::is_eagle3(&drafter_config));
    let weights = Weights::load_dir(&dir.join("eagle3"), &drafter_config).unwrap();
    let facts = model.facts();
    let (hidden, layers, rows) = (facts.hidden_size, facts.layers, facts.embedding_rows);
    let drafter = Eagle3::load(&drafter_config, weights, hidden, layers, rows).unwrap();
    assert_eq!(
        drafter.block_size as u64,
        reference["block_size"].as_u64().unwrap()
    );
    let capture = list(&reference, "capture_layer_ids");
    let tap = Tap::Layers(capture.iter().map(|&i| i as usize).collect());
    assert_eq!(Tap::Layers(drafter.capture_layers.clone()), tap);
    two_rounds(
        "eagle3",
        &reference,
        &*model,
        &tap,
        drafter.block_size - 1,
        |prompt, sink| {
            ChainDraft::new(&*model, Some(&drafter), prompt, (Some(sink), None))
                .unwrap()
                .unwrap()
        },
    );
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
    let first = *greedy(&logits).last().unwrap();
    assert_eq!(first, reference["first"].as_u64().unwrap() as u32);

    let shifted = [&prompt[1..], &[first]].concat();
    let shifted = Array::from_slice(&shifted, &[1, prompt.len() as i32]);
    let mut head = model.mtp_caches();
    let (guessed, own) = model.mtp_forward(&shifted, &hidden, &mut head).unwrap();
    assert_eq!(greedy(&guessed), list("guesses"));

    let last = Array::from_int(own.dim(1) - 1);
    let mut token = Array::from_slice(&[*list("guesses").last().unwrap()], &[1, 1]);
    let mut h = own.take_axis(&last, 1).unwrap().expand_dims(1).unwrap();
    let mut chained = Vec::new();
    for _ in 0..list("chained").len() {
        let (logits, next) = model.mtp_forward(&token, &h, &mut head).unwrap();
        chained.push(greedy(&logits)[0]);
        token = Array::from_slice(&[chained[chained.len() - 1]], &[1, 1]);
        h = next;
    }
    assert_eq!(chained, list("chained"));
}
