//! The importer on a tiny synthetic Llama whose Hugging Face weights are known.

use std::path::Path;

use safetensors::SafeTensors;
use serde_json::Value;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use super::*;
use crate::test_file::TestGguf;
use crate::MetadataValue as V;

const HIDDEN: usize = 8;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 4;
const FFN: usize = 12;
const LAYERS: usize = 2;

fn tokens() -> Vec<String> {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    tokens.extend(alphabet.iter().map(|c| c.to_string()));
    tokens.push("Ġt".into());
    tokens
}

/// A matrix whose every entry is distinct: `seed * 1000 + row * cols + col`.
fn matrix(seed: usize, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| (seed * 1000 + i) as f32).collect()
}

/// What llama.cpp's converter does to q/k rows (per head, `(2, hd/2)` -> `(hd/2, 2)`).
fn permute_like_llama_cpp(hf: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let head_dim = hf.len() / cols / heads;
    let mut out = vec![0.0; hf.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..head_dim / 2 {
                let src = h * head_dim + j * head_dim / 2 + i;
                let dst = h * head_dim + 2 * i + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn tiny_llama(untied: bool) -> TestGguf {
    let tokens = tokens();
    let vocab = tokens.len();
    let mut types = vec![V::I32(1); vocab];
    types[..3].fill(V::I32(3));
    let mut spec = TestGguf::new()
        .kv("general.architecture", V::String("llama".into()))
        .kv("llama.embedding_length", V::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", V::U32(FFN as u32))
        .kv("llama.block_count", V::U32(LAYERS as u32))
        .kv("llama.attention.head_count", V::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", V::U32(KV_HEADS as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-6))
        .kv("llama.rope.freq_base", V::F32(50000.0))
        .kv("llama.context_length", V::U32(256))
        .kv("tokenizer.ggml.model", V::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", V::String("smollm".into()))
        .kv(
            "tokenizer.ggml.tokens",
            V::Array(tokens.into_iter().map(V::String).collect()),
        )
        .kv("tokenizer.ggml.token_type", V::Array(types))
        .kv(
            "tokenizer.ggml.merges",
            V::Array(vec![V::String("Ġ t".into())]),
        )
        .kv("tokenizer.ggml.bos_token_id", V::U32(1))
        .kv("tokenizer.ggml.eos_token_id", V::U32(2))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(true))
        .kv(
            "tokenizer.chat_template",
            V::String("{{ messages }}".into()),
        );
    let dims = |rows: usize, cols: usize| [cols as u64, rows as u64];
    spec = spec.f32_tensor(
        "token_embd.weight",
        &dims(vocab, HIDDEN),
        &matrix(1, vocab, HIDDEN),
    );
    spec = spec.f32_tensor(
        "output_norm.weight",
        &[HIDDEN as u64],
        &matrix(2, 1, HIDDEN),
    );
    if untied {
        spec = spec.f32_tensor(
            "output.weight",
            &dims(vocab, HIDDEN),
            &matrix(3, vocab, HIDDEN),
        );
    }
    for l in 0..LAYERS {
        let seed = 10 * (l + 1);
        let q = permute_like_llama_cpp(&matrix(seed, HEADS * HEAD_DIM, HIDDEN), HEADS, HIDDEN);
        let k = permute_like_llama_cpp(
            &matrix(seed + 1, KV_HEADS * HEAD_DIM, HIDDEN),
            KV_HEADS,
            HIDDEN,
        );
        spec = spec
            .f32_tensor(
                &format!("blk.{l}.attn_q.weight"),
                &dims(HEADS * HEAD_DIM, HIDDEN),
                &q,
            )
            .f32_tensor(
                &format!("blk.{l}.attn_k.weight"),
                &dims(KV_HEADS * HEAD_DIM, HIDDEN),
                &k,
            )
            .f32_tensor(
                &format!("blk.{l}.attn_v.weight"),
                &dims(KV_HEADS * HEAD_DIM, HIDDEN),
                &matrix(seed + 2, KV_HEADS * HEAD_DIM, HIDDEN),
            )
            .f32_tensor(
                &format!("blk.{l}.attn_output.weight"),
                &dims(HIDDEN, HEADS * HEAD_DIM),
                &matrix(seed + 3, HIDDEN, HEADS * HEAD_DIM),
            )
            .f32_tensor(
                &format!("blk.{l}.ffn_gate.weight"),
                &dims(FFN, HIDDEN),
                &matrix(seed + 4, FFN, HIDDEN),
            )
            .f32_tensor(
                &format!("blk.{l}.ffn_up.weight"),
                &dims(FFN, HIDDEN),
                &matrix(seed + 5, FFN, HIDDEN),
            )
            .f32_tensor(
                &format!("blk.{l}.ffn_down.weight"),
                &dims(HIDDEN, FFN),
                &matrix(seed + 6, HIDDEN, FFN),
            )
            .f32_tensor(
                &format!("blk.{l}.attn_norm.weight"),
                &[HIDDEN as u64],
                &matrix(seed + 7, 1, HIDDEN),
            )
            .f32_tensor(
                &format!("blk.{l}.ffn_norm.weight"),
                &[HIDDEN as u64],
                &matrix(seed + 8, 1, HIDDEN),
            );
    }
    spec
}

fn import(spec: &TestGguf) -> (tempfile::TempDir, Result<ImportReport, ImportError>) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    fs::write(&gguf, spec.build()).unwrap();
    let result = import_hf_dir(&gguf, &dir.path().join("out"));
    (dir, result)
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    let view = st.tensor(name).unwrap();
    view.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn untied_model_round_trips_to_hf_layout() {
    let (dir, report) = import(&tiny_llama(true));
    let report = report.unwrap();
    let out = dir.path().join("out");
    assert!(!report.tied_embeddings);
    assert_eq!(report.tensors_written, 3 + 9 * LAYERS);

    let config = json_file(&out.join("config.json"));
    assert_eq!(config["tie_word_embeddings"], false);
    assert_eq!(config["vocab_size"], 260);
    assert_eq!(config["num_key_value_heads"], 1);
    assert_eq!(config["head_dim"], HIDDEN / HEADS);
    assert_eq!(config["rms_norm_eps"], 1e-6);
    assert_eq!(config["rope_theta"], 50000.0);
    assert_eq!(config["max_position_embeddings"], 256);

    let bytes = fs::read(out.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(floats(&st, "lm_head.weight"), matrix(3, 260, HIDDEN));
    assert_eq!(st.tensor("lm_head.weight").unwrap().shape(), [260, HIDDEN]);
    assert_eq!(
        st.tensor("model.layers.1.mlp.down_proj.weight")
            .unwrap()
            .shape(),
        [HIDDEN, FFN]
    );
    for l in 0..LAYERS {
        let seed = 10 * (l + 1);
        let layer = |s: &str| format!("model.layers.{l}.{s}");
        // The permutation is undone: q and k come back exactly as the HF matrices.
        assert_eq!(
            floats(&st, &layer("self_attn.q_proj.weight")),
            matrix(seed, HEADS * HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            floats(&st, &layer("self_attn.k_proj.weight")),
            matrix(seed + 1, HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            floats(&st, &layer("self_attn.v_proj.weight")),
            matrix(seed + 2, HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            floats(&st, &layer("post_attention_layernorm.weight")),
            matrix(seed + 8, 1, HIDDEN)
        );
    }

    let tok_config = json_file(&out.join("tokenizer_config.json"));
    assert_eq!(tok_config["add_bos_token"], true);
    assert_eq!(tok_config["bos_token"], "<|im_start|>");
    assert_eq!(tok_config["chat_template"], "{{ messages }}");
    // add_bos_token: the saved tokenizer itself prepends <|im_start|>.
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let t = tok.token_to_id("t").unwrap();
    let space_t = tok.token_to_id("Ġt").unwrap();
    assert_eq!(tok.encode("t t", true).unwrap().get_ids(), [1, t, space_t]);
    assert_eq!(tok.encode("<|im_end|>t", false).unwrap().get_ids(), [2, t]);
}

#[test]
fn tied_model_has_no_lm_head() {
    let (dir, report) = import(&tiny_llama(false));
    assert!(report.unwrap().tied_embeddings);
    let bytes = fs::read(dir.path().join("out/model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.tensor("lm_head.weight").is_err());
    assert_eq!(
        json_file(&dir.path().join("out/config.json"))["tie_word_embeddings"],
        true
    );
}

#[test]
fn refuses_what_it_cannot_convert() {
    let mut spec = tiny_llama(false);
    spec.metadata[0].1 = V::String("gpt9".into());
    assert!(matches!(import(&spec).1, Err(ImportError::UnsupportedArchitecture(a)) if a == "gpt9"));

    let mut spec = tiny_llama(false);
    spec.tensors.retain(|t| t.0 != "blk.1.ffn_up.weight");
    assert!(
        matches!(import(&spec).1, Err(ImportError::Inconsistent(m)) if m.contains("layers.1.mlp.up_proj"))
    );

    let spec = tiny_llama(false).f32_tensor("blk.0.mystery.weight", &[2], &[0.0, 0.0]);
    assert!(matches!(
        import(&spec).1,
        Err(ImportError::UnmappedTensor(_))
    ));

    let mut spec = tiny_llama(false);
    spec.metadata.retain(|(k, _)| k != "tokenizer.ggml.pre");
    spec = spec.kv("tokenizer.ggml.pre", V::String("qwen9".into()));
    assert!(matches!(import(&spec).1, Err(ImportError::Tokenizer(m)) if m.contains("qwen9")));
}

#[test]
fn llama3_rope_factors_become_rope_scaling_and_other_tables_are_refused() {
    // Heads of 4 features: two frequencies. At base 1e9 the second's wavelength (about 2e5) is
    // past Llama 3's 8192 / 1: its factor is the scaling's; the first's (2 pi) keeps 1.
    let with_factors = |factors: &[f32]| {
        let mut spec = tiny_llama(false);
        for (key, value) in spec.metadata.iter_mut() {
            if key == "llama.rope.freq_base" {
                *value = V::F32(1e9);
            }
        }
        spec.f32_tensor("rope_freqs.weight", &[factors.len() as u64], factors)
    };
    assert_eq!(HIDDEN / HEADS, 4);
    let (dir, report) = import(&with_factors(&[1.0, 32.0]));
    report.unwrap();
    let out = dir.path().join("out");
    let config = json_file(&out.join("config.json"));
    assert_eq!(config["rope_scaling"]["rope_type"], "llama3");
    assert_eq!(config["rope_scaling"]["factor"], 32.0);
    assert_eq!(
        config["rope_scaling"]["original_max_position_embeddings"],
        8192
    );
    let st = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&st).unwrap();
    assert!(st.names().iter().all(|n| !n.contains("rope_freqs")));
    // Scaled where Llama 3 keeps the frequency: another scaling, refused by name.
    assert!(matches!(
        import(&with_factors(&[32.0, 32.0])).1,
        Err(ImportError::Inconsistent(m)) if m.contains("not Llama 3's scaling")
    ));
}

#[test]
fn an_lfm2_file_without_its_layer_kinds_is_refused() {
    let mut spec = tiny_llama(false);
    for (key, value) in spec.metadata.iter_mut() {
        if let Some(rest) = key.strip_prefix("llama.") {
            *key = format!("lfm2.{rest}");
        }
        if key == "general.architecture" {
            *value = V::String("lfm2".into());
        }
    }
    assert!(matches!(
        import(&spec).1,
        Err(ImportError::Inconsistent(m)) if m.contains("head_count_kv") && m.contains("l_cache")
    ));
}

#[test]
fn unpermute_one_head_of_four_rows() {
    // GGUF rows interleave the halves: [a0, b0, a1, b1] -> HF [a0, a1, b0, b1].
    let gguf = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
    let hf = unpermute_rows(&gguf, 1, 2);
    assert_eq!(hf, [0.0, 0.5, 2.0, 2.5, 1.0, 1.5, 3.0, 3.5]);
}

#[test]
fn unpermute_inverts_the_converter_permutation_per_head() {
    let (heads, head_dim, cols) = (3, 8, 2);
    let hf = matrix(0, heads * head_dim, cols);
    let gguf = permute_like_llama_cpp(&hf, heads, cols);
    assert_ne!(gguf, hf);
    assert_eq!(unpermute_rows(&gguf, heads, cols), hf);
}

#[test]
fn qwen2_pre_tokenizer_composes_and_splits_like_qwen2() {
    let mut spec = tiny_llama(false);
    spec.metadata.retain(|(k, _)| k != "tokenizer.ggml.pre");
    spec = spec.kv("tokenizer.ggml.pre", V::String("qwen2".into()));
    let (dir, report) = import(&spec);
    report.unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("out/tokenizer.json")).unwrap();
    let ids = |text: &str| tok.encode(text, false).unwrap().get_ids().to_vec();
    let space_t = tok.token_to_id("Ġt").unwrap();
    assert_eq!(ids("t t")[1..], [space_t]);
    // NFC first: a decomposed "é" is the two bytes of the composed one, not three.
    assert_eq!(ids("e\u{301}"), ids("\u{e9}"));
    assert_eq!(ids("e\u{301}").len(), 2);
    // Digits one by one.
    assert_eq!(ids("123").len(), 3);
}

/// The pieces `pre` splits `text` into before BPE, as the imported tokenizer.json does it.
fn pre_split(pre: &str, text: &str) -> Vec<String> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let mut spec = tiny_llama(false);
    spec.metadata.retain(|(k, _)| k != "tokenizer.ggml.pre");
    spec = spec.kv("tokenizer.ggml.pre", V::String(pre.into()));
    let (dir, report) = import(&spec);
    report.unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("out/tokenizer.json")).unwrap();
    let mut pieces = PreTokenizedString::from(text);
    tok.get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut pieces)
        .unwrap();
    pieces
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(piece, _, _)| piece.to_owned())
        .collect()
}

#[test]
fn split_rules_follow_each_family() {
    // Byte-level pieces: "Ġ" is a space.
    assert_eq!(
        pre_split("qwen2", "x 12345"),
        ["x", "Ġ", "1", "2", "3", "4", "5"]
    );
    assert_eq!(pre_split("llama-bpe", "x 12345"), ["x", "Ġ", "123", "45"]);
    assert_eq!(
        pre_split("tekken", "HelloWorld it's"),
        ["Hello", "World", "Ġit", "'s"]
    );
    assert_eq!(
        pre_split("gpt-4o", "HelloWorld it's"),
        ["Hello", "World", "Ġit's"]
    );
}
