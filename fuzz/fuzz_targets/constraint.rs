//! Arbitrary text as a constraint (the first byte picks a GBNF grammar, a Lark grammar, a regex
//! or a JSON schema), compiled against a small byte-level vocabulary, then followed for a few
//! tokens: it compiles or fails with an error, and a compiled guide masks and advances (always
//! taking the first allowed token) without panicking.
#![no_main]

use std::collections::BTreeSet;
use std::sync::OnceLock;

use constrain::{Constraint, Guide, TokenMask, Vocabulary};
use libfuzzer_sys::fuzz_target;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Tokenizer;

/// One token per byte (GPT-2's byte-level alphabet, no merges) and `</s>` as the last id.
fn vocabulary() -> &'static Vocabulary {
    static VOCAB: OnceLock<Vocabulary> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        alphabet.sort();
        let vocab: serde_json::Map<String, serde_json::Value> = (alphabet.iter().enumerate())
            .map(|(i, c)| (c.to_string(), i.into()))
            .collect();
        let eos = alphabet.len();
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": eos, "content": "</s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                              "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                        "use_regex": false},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}
        });
        let tokenizer = Tokenizer::from_bytes(json.to_string()).expect("a valid tokenizer");
        Vocabulary::new(&tokenizer, &BTreeSet::from([eos as u32]), eos + 1).expect("a vocabulary")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let constraint = match kind % 4 {
        0 => Constraint::Gbnf(text.into()),
        1 => Constraint::Lark(text.into()),
        2 => Constraint::Regex(text.into()),
        _ => match serde_json::from_str(text) {
            Ok(schema) => Constraint::JsonSchema(schema),
            Err(_) => return,
        },
    };
    let Ok(mut guide) = Guide::new(vocabulary(), &constraint, None) else {
        return;
    };
    let mut allowed = TokenMask::default();
    for _ in 0..16 {
        if guide.is_finished() || guide.allowed(&mut allowed).is_err() {
            return;
        }
        let Some(token) = allowed.ids().next() else {
            return;
        };
        if guide.advance(token).is_err() {
            return;
        }
    }
});
