//! The streaming detokenizer against full decodes of real tokenizers: for many token
//! sequences the concatenated deltas must equal `decode(ids, skip_special_tokens=true)`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::Rng;
use text::{ModelFiles, ModelTokenizer, StreamingDetokenizer, Tokenizer};

/// The largest window the detokenizer may hold (16 held tokens plus the prefix).
const WINDOW_BOUND: usize = 20;

fn model(tokenizer: Tokenizer) -> ModelTokenizer {
    ModelTokenizer::from_parts(tokenizer, ModelFiles::default()).unwrap()
}

/// Streams `ids` and checks the deltas against a full decode; returns the deltas.
fn check_stream(tokenizer: &ModelTokenizer, ids: &[u32]) -> Vec<String> {
    let mut detok = tokenizer.detokenizer();
    let mut deltas = Vec::new();
    for &id in ids {
        deltas.push(detok.push(id).unwrap());
        assert!(
            detok.window_len() <= WINDOW_BOUND,
            "window grew to {}",
            detok.window_len()
        );
    }
    deltas.push(detok.finish().unwrap());
    let streamed: String = deltas.concat();
    let full = tokenizer.decode(ids, true).unwrap();
    assert_eq!(streamed, full, "ids {ids:?}\ndeltas {deltas:?}");
    deltas
}

/// Random ids from the whole vocabulary, special tokens included.
fn random_ids(tokenizer: &ModelTokenizer, rng: &mut Rng) -> Vec<u32> {
    let vocab = tokenizer.vocab_size();
    let len = 1 + rng.below(48);
    (0..len).map(|_| rng.below(vocab) as u32).collect()
}

/// Ids of random realistic text, with special tokens sprinkled in.
fn encoded_ids(tokenizer: &ModelTokenizer, rng: &mut Rng) -> Vec<u32> {
    let mut ids = tokenizer.encode(&common::random_text(rng), false).unwrap();
    let specials: Vec<u32> = tokenizer.special_token_ids().iter().copied().collect();
    if !specials.is_empty() && rng.below(3) == 0 {
        let at = rng.below(ids.len() + 1);
        ids.insert(at, specials[rng.below(specials.len())]);
    }
    ids
}

#[test]
fn byte_level_bpe_random_ids_match_full_decode() {
    let tokenizer = model(common::byte_level_bpe());
    let mut rng = Rng::new(1);
    for _ in 0..600 {
        check_stream(&tokenizer, &random_ids(&tokenizer, &mut rng));
    }
}

#[test]
fn byte_level_bpe_encoded_text_matches_full_decode() {
    let tokenizer = model(common::byte_level_bpe());
    let mut rng = Rng::new(2);
    for _ in 0..600 {
        check_stream(&tokenizer, &encoded_ids(&tokenizer, &mut rng));
    }
}

#[test]
fn sentencepiece_random_ids_match_full_decode() {
    let tokenizer = model(common::unigram_metaspace());
    let mut rng = Rng::new(3);
    for _ in 0..600 {
        check_stream(&tokenizer, &random_ids(&tokenizer, &mut rng));
    }
}

#[test]
fn sentencepiece_encoded_text_matches_full_decode() {
    let tokenizer = model(common::unigram_metaspace());
    let mut rng = Rng::new(4);
    for _ in 0..600 {
        check_stream(&tokenizer, &encoded_ids(&tokenizer, &mut rng));
    }
}

#[test]
fn byte_fallback_encoded_text_matches_full_decode() {
    // Random ids are left out on purpose: ByteFallback decides whether a run of byte tokens
    // is valid UTF-8 only when the run ends, which no stream can know in advance.
    let tokenizer = model(common::llama_style_byte_fallback());
    let mut rng = Rng::new(5);
    for _ in 0..600 {
        check_stream(&tokenizer, &encoded_ids(&tokenizer, &mut rng));
    }
}

#[test]
fn an_emoji_split_over_byte_tokens_comes_out_whole() {
    let tokenizer = model(common::byte_level_bpe());
    let ids = tokenizer.encode("ok🦀", false).unwrap();
    let ok = tokenizer.encode("ok", false).unwrap();
    // "🦀" is not in the training corpus: several byte-level tokens after those of "ok".
    let crab = ids.len() - ok.len();
    assert!(crab >= 2, "{ids:?}");
    let deltas = check_stream(&tokenizer, &ids);
    let mut expected = vec![""; crab - 1];
    expected.extend(["🦀", ""]);
    assert_eq!(deltas[ok.len()..], expected);
    assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
}

#[test]
fn byte_fallback_character_comes_out_whole() {
    let tokenizer = model(common::llama_style_byte_fallback());
    let ids = tokenizer.encode("hi 🦀", false).unwrap();
    let bytes = ids
        .iter()
        .filter(|&&id| {
            tokenizer
                .id_to_token(id)
                .is_some_and(|t| t.starts_with("<0x"))
        })
        .count();
    assert_eq!(bytes, 4, "🦀 should fall back to four byte tokens: {ids:?}");
    let deltas = check_stream(&tokenizer, &ids);
    assert!(
        deltas.contains(&"🦀".to_string()) || deltas.contains(&" 🦀".to_string()),
        "{deltas:?}"
    );
}

#[test]
fn sentencepiece_keeps_spaces_between_words() {
    let tokenizer = model(common::unigram_metaspace());
    let text = "Hello world, how are you today?";
    let ids = tokenizer.encode(text, false).unwrap();
    let deltas = check_stream(&tokenizer, &ids);
    assert_eq!(deltas.concat(), text);
    // Each token's text arrives with its own step, leading space included.
    for i in 0..ids.len() {
        let before = tokenizer.decode(&ids[..i], true).unwrap();
        let after = tokenizer.decode(&ids[..=i], true).unwrap();
        assert_eq!(deltas[i], after[before.len()..], "token {i} of {ids:?}");
    }
    assert!(deltas.iter().any(|d| d.starts_with(' ')), "{deltas:?}");
}

#[test]
fn special_tokens_are_skipped() {
    let tokenizer = model(common::byte_level_bpe());
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let mut ids = tokenizer.encode("Hi there", false).unwrap();
    ids.push(im_end);
    let deltas = check_stream(&tokenizer, &ids);
    assert_eq!(deltas.concat(), "Hi there");
}

#[test]
fn the_window_stays_small_over_a_long_generation() {
    let tokenizer = model(common::llama_style_byte_fallback());
    let text = common::CORPUS.concat().repeat(20);
    let ids = tokenizer.encode(&text, false).unwrap();
    assert!(ids.len() > 3000);
    let mut detok = tokenizer.detokenizer();
    let mut out = String::new();
    let mut widest = 0;
    for &id in &ids {
        out.push_str(&detok.push(id).unwrap());
        widest = widest.max(detok.window_len());
    }
    out.push_str(&detok.finish().unwrap());
    assert_eq!(out, tokenizer.decode(&ids, true).unwrap());
    assert!(widest <= 6, "window grew to {widest} tokens");
}

#[test]
fn detokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<StreamingDetokenizer>();
    assert_send_sync::<ModelTokenizer>();
    // Also usable straight from a tokenizers-crate tokenizer.
    let detok =
        StreamingDetokenizer::new(Arc::new(common::byte_level_bpe()), Arc::new(HashSet::new()));
    assert_eq!(detok.window_len(), 0);
}

#[test]
fn smollm2_tokenizer_streams_exactly() {
    let Some(dir) = common::smollm2_dir_if_present() else {
        return;
    };
    let tokenizer = ModelTokenizer::from_dir(&dir).unwrap();
    assert_eq!(tokenizer.vocab_size(), 49152);
    let mut rng = Rng::new(6);
    for _ in 0..300 {
        check_stream(&tokenizer, &random_ids(&tokenizer, &mut rng));
        check_stream(&tokenizer, &encoded_ids(&tokenizer, &mut rng));
    }
}
