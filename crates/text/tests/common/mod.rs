//! Small but real tokenizers, trained or built here with the tokenizers crate, and a seeded
//! random source for property tests.

#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;

use serde_json::{json, Value};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::unigram::{Unigram, UnigramTrainer};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::{AddedToken, Tokenizer};

/// Training text: English, French, German, Russian, Chinese, Japanese, emoji (with skin tone
/// and ZWJ sequences), code and numbers.
pub const CORPUS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello there, how are you today?",
    "Le café est très bon à Paris, n'est-ce pas ? Où est l'hôtel ?",
    "Größe, Straße, Übermut und Äpfel schmecken süß.",
    "Привет, мир! Как дела? Всё хорошо.",
    "你好，世界！今天天气很好。我们去公园吧。",
    "こんにちは世界。ありがとうございます。",
    "I love pizza 🍕 and parties 🎉🎉 and thumbs up 👍🏽 for the family 👨‍👩‍👧 😀😀",
    "fn main() { println!(\"{}\", 1 + 2 * 3); }",
    "    indented line\n\ttabbed line\n\nnew paragraph 12345 67890",
];

/// A byte-level BPE (GPT-2 / SmolLM2 / Qwen style) trained on [`CORPUS`], with ChatML
/// special tokens `<|endoftext|>` (0), `<|im_start|>` (1), `<|im_end|>` (2).
pub fn byte_level_bpe() -> Tokenizer {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(
        tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, true),
    ));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(600)
        .min_frequency(1)
        .initial_alphabet(
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .collect(),
        )
        .special_tokens(vec![
            AddedToken::from("<|endoftext|>", true),
            AddedToken::from("<|im_start|>", true),
            AddedToken::from("<|im_end|>", true),
        ])
        .build()
        .into();
    tokenizer
        .train(&mut trainer, corpus_lines())
        .expect("training a BPE on the corpus");
    tokenizer
}

/// A SentencePiece-style Unigram with a Metaspace pre-tokenizer and decoder (`▁` for spaces,
/// a `▁` prepended to the text and dropped again when decoding), trained on [`CORPUS`].
pub fn unigram_metaspace() -> Tokenizer {
    let metaspace = Metaspace::new('▁', PrependScheme::Always, true);
    let mut tokenizer = Tokenizer::new(Unigram::default());
    tokenizer.with_pre_tokenizer(Some(metaspace.clone()));
    tokenizer.with_decoder(Some(metaspace));
    let mut trainer: TrainerWrapper = UnigramTrainer::builder()
        .show_progress(false)
        .vocab_size(400)
        .unk_token(Some("<unk>".into()))
        .special_tokens(vec![
            AddedToken::from("<unk>", true),
            AddedToken::from("<s>", true),
            AddedToken::from("</s>", true),
        ])
        .build()
        .unwrap()
        .into();
    tokenizer
        .train(&mut trainer, corpus_lines())
        .expect("training a Unigram on the corpus");
    tokenizer
}

/// A Llama-2 / Mistral / Gemma-style tokenizer.json: the trained Unigram's pieces plus the
/// 256 byte tokens `<0x00>`..`<0xFF>` with byte fallback, a normalizer that turns spaces
/// into `▁` and prepends one, a post-processor that adds `<s>`, and the decoder chain
/// Replace(▁→space), ByteFallback, Fuse, Strip(one leading space).
pub fn llama_style_byte_fallback() -> Tokenizer {
    let trained: Value =
        serde_json::from_str(&unigram_metaspace().to_string(false).unwrap()).unwrap();
    let mut vocab: Vec<Value> = trained["model"]["vocab"].as_array().unwrap().clone();
    for byte in 0..=255u8 {
        vocab.push(json!([format!("<0x{byte:02X}>"), -100.0]));
    }
    let added: Vec<Value> = ["<unk>", "<s>", "</s>"]
        .iter()
        .map(|content| {
            let id = vocab.iter().position(|v| v[0] == *content).unwrap();
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bos_id = vocab.iter().position(|v| v[0] == "<s>").unwrap();
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [bos_id], "tokens": ["<s>"]}}
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": true}
    });
    spec.to_string()
        .parse()
        .expect("a valid Llama-style tokenizer.json")
}

fn corpus_lines() -> impl Iterator<Item = &'static str> + Send {
    // Repeated so that the trainers see enough pairs to merge.
    CORPUS.iter().copied().cycle().take(CORPUS.len() * 20)
}

/// Where the SmolLM2 importer writes its Hugging Face directory.
pub fn smollm2_dir() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/mlx-worker/models/SmolLM2-135M-Instruct")
}

/// The SmolLM2 directory when it holds a tokenizer.json; `None` (skip) otherwise, unless
/// `MLX_WORKER_REQUIRE_MODELS=1`, where its absence fails the test.
pub fn smollm2_dir_if_present() -> Option<PathBuf> {
    let dir = smollm2_dir();
    if dir.join("tokenizer.json").is_file() {
        return Some(dir);
    }
    if std::env::var("MLX_WORKER_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "MLX_WORKER_REQUIRE_MODELS=1 but {} has no tokenizer.json; import the SmolLM2 model first",
            dir.display()
        );
    }
    eprintln!("skipped: {} is not there", dir.display());
    None
}

/// A small seeded PCG-style generator: the same cases on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n
    }
}

/// Random text made of pieces that stress detokenizers: multi-byte letters, CJK, emoji
/// (incl. modifiers and ZWJ sequences, and some the tokenizers never saw), runs of spaces,
/// newlines, a literal U+FFFD.
pub fn random_text(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &[
        "the",
        " ",
        "  ",
        "Hello",
        " world",
        "é",
        "ü",
        "ß",
        "Größe",
        "Привет",
        "世界",
        "天气",
        "こんにちは",
        "😀",
        "🎉",
        "👍🏽",
        "👨‍👩‍👧",
        "🦀",
        "🧑‍🚀",
        "\n",
        "\t",
        "a",
        "Z",
        "123",
        ",",
        "!",
        " 🍕",
        "café",
        "ǅ",
        "\u{FFFD}",
        "fn()",
        "{}",
    ];
    let n = 1 + rng.below(20);
    (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}
