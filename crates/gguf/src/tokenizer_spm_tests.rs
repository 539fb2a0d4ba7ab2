//! SentencePiece BPE from a tiny synthetic vocabulary.

use super::*;
use crate::test_file::TestGguf;
use crate::MetadataValue as V;

/// (piece, score, type): controls, bytes, a whitespace run stored with real spaces (as
/// llama.cpp writes Gemma's), a user-defined newline, then normal pieces by falling score.
const PIECES: [(&str, f32, i32); 14] = [
    ("<pad>", -1000.0, 3),
    ("<eos>", -1000.0, 3),
    ("<bos>", -1000.0, 3),
    ("<unk>", -1000.0, 2),
    ("<0x0A>", 0.0, 6),
    ("<0xC3>", 0.0, 6),
    ("<0xA9>", 0.0, 6),
    ("  ", -1000.0, 4),
    ("\n", -1000.0, 4),
    ("\u{2581}", 0.0, 1),
    ("a", -1.0, 1),
    ("b", -2.0, 1),
    ("\u{2581}a", -3.0, 1),
    ("ab", -4.0, 1),
];

fn file(add_space_prefix: bool) -> GgufFile {
    let spec = TestGguf::new()
        .kv("general.architecture", V::String("llama".into()))
        .kv("tokenizer.ggml.model", V::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            V::Array(PIECES.iter().map(|p| V::String(p.0.into())).collect()),
        )
        .kv(
            "tokenizer.ggml.scores",
            V::Array(PIECES.iter().map(|p| V::F32(p.1)).collect()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            V::Array(PIECES.iter().map(|p| V::I32(p.2)).collect()),
        )
        .kv("tokenizer.ggml.bos_token_id", V::U32(2))
        .kv("tokenizer.ggml.eos_token_id", V::U32(1))
        .kv("tokenizer.ggml.unknown_token_id", V::U32(3))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(true))
        .kv("tokenizer.ggml.add_space_prefix", V::Bool(add_space_prefix));
    GgufFile::from_bytes(spec.build()).unwrap()
}

fn ids(tok: &Tokenizer, text: &str, special: bool) -> Vec<u32> {
    tok.encode(text, special).unwrap().get_ids().to_vec()
}

#[test]
fn merges_rank_user_defined_first_then_by_score() {
    let tok = sentencepiece_bpe(&file(false)).unwrap();
    // "▁a" (score -3) beats "ab" (score -4): " ab" is "▁a" + "b".
    assert_eq!(ids(&tok, " ab", false), [12, 11]);
    assert_eq!(ids(&tok, "ab", false), [13]);
    // The whitespace run is spelled "▁▁" and merged before anything else: "  a" is "▁▁" + "a".
    assert_eq!(tok.id_to_token(7).as_deref(), Some("\u{2581}\u{2581}"));
    assert_eq!(ids(&tok, "  a", false), [7, 10]);
    // User-defined "\n" is matched whole; é falls back to its UTF-8 bytes.
    assert_eq!(ids(&tok, "a\né", false), [10, 8, 5, 6]);
    assert_eq!(tok.decode(&[10, 8, 5, 6], false).unwrap(), "a\né");
    assert_eq!(tok.decode(&[7, 10], false).unwrap(), "  a");
    // Control tokens are special; BOS comes first when asked for.
    assert_eq!(ids(&tok, "<eos>a", false), [1, 10]);
    assert_eq!(ids(&tok, "a", true), [2, 10]);
    assert_eq!(tok.decode(&[2, 10, 1], true).unwrap(), "a");
}

#[test]
fn space_prefix_is_added_and_stripped_when_the_file_says_so() {
    let tok = sentencepiece_bpe(&file(true)).unwrap();
    assert_eq!(ids(&tok, "ab", false), [12, 11]);
    assert_eq!(tok.decode(&[12, 11], false).unwrap(), "ab");
}

#[test]
fn derived_merges_skip_control_and_byte_pieces() {
    let tokens: Vec<String> = ["<", "s>", "<s>", "x", "y", "xy"]
        .map(String::from)
        .to_vec();
    let types = [1, 1, 3, 1, 1, 1];
    let scores = [-1.0, -2.0, 0.0, -3.0, -4.0, -5.0];
    let vocab = crate::tokenizer::vocab_map(&tokens).unwrap();
    let merges = derive_merges(&tokens, &types, &scores, &vocab);
    assert_eq!(merges, [("x".to_owned(), "y".to_owned())]);
}
