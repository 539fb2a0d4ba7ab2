//! Checks against the real Gemma 3 270M GGUF (see /work/shared/models.md).
//!
//! The file comes from `cargo xtask setup` (cached under `$XDG_CACHE_HOME` or `~/.cache`, in
//! `mlx-worker/gguf/`) or from `MLX_WORKER_GEMMA3_GGUF`. Without it these tests print a note
//! and pass, unless `MLX_WORKER_REQUIRE_MODELS=1`, which makes a missing file a failure.
//!
//! The expected token ids come from the independent reference: transformers 5.24's GGUF
//! tokenizer builder on the same file (`cargo xtask check-import` repeats that comparison).

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile};
use safetensors::SafeTensors;
use serde_json::json;
use tokenizers::Tokenizer;

mod common;

use common::{read_json, tensor_f32};

const FILE_NAME: &str = "gemma-3-270m-q4_k_m.gguf";
const LAYERS: usize = 18;

fn gguf_path() -> Option<PathBuf> {
    common::real_gguf("MLX_WORKER_GEMMA3_GGUF", FILE_NAME)
}

/// The checkpoint imported once, into a temporary directory that goes when the test ends;
/// each check below reads it in turn.
#[test]
fn imported_checkpoint() {
    let Some(gguf) = gguf_path() else { return };
    let dir = common::import(&gguf, |report| {
        assert_eq!(report.architecture, "gemma3");
        assert!(report.tied_embeddings);
        assert_eq!(report.tensors_written, 2 + LAYERS * 13);
        assert_eq!(report.parameters, 268_098_176);
        assert_eq!(report.vocab_size, 262_144);
    });
    config_is_what_mlx_lm_gemma3_text_reads(dir.path());
    norms_are_shifted_back_and_projections_are_not_permuted(dir.path());
    tokenizer_matches_the_reference_encodings(dir.path());
}

#[test]
fn metadata_and_tensor_table() {
    let Some(path) = gguf_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.architecture().unwrap(), "gemma3");
    assert_eq!(file.require::<u64>("gemma3.block_count").unwrap(), 18);
    assert_eq!(file.require::<u64>("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(
        file.require::<u64>("gemma3.attention.key_length").unwrap(),
        256
    );
    assert_eq!(
        file.require::<u64>("gemma3.attention.sliding_window")
            .unwrap(),
        512
    );
    assert_eq!(
        file.require::<String>("tokenizer.ggml.model").unwrap(),
        "llama"
    );
    assert!(!file
        .require::<bool>("tokenizer.ggml.add_space_prefix")
        .unwrap());
    assert!(file.get("tokenizer.chat_template").is_none());
    assert!(file.get("tokenizer.ggml.merges").is_none());
    assert_eq!(file.tensors().len(), 236);
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.shape(), [262_144, 640]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(
        file.tensor("blk.0.attn_output.weight").unwrap().ggml_type,
        GgmlType::Q4K
    );
    assert!(file.tensor("output.weight").is_none(), "the head is tied");
}

fn config_is_what_mlx_lm_gemma3_text_reads(dir: &Path) {
    let config = read_json(&dir.join("config.json"));
    let expect = json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": null,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 256,
        "max_position_embeddings": 32768,
        "vocab_size": 262_144,
        "tie_word_embeddings": true,
        "bos_token_id": 2,
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
    });
    for (key, value) in expect.as_object().unwrap() {
        assert_eq!(&config[key], value, "config.json {key}");
    }
    let types = config["layer_types"].as_array().unwrap();
    assert_eq!(types.len(), LAYERS);
    let global: Vec<usize> = (0..LAYERS)
        .filter(|&i| types[i] == "full_attention")
        .collect();
    assert_eq!(global, [5, 11, 17]);
    let generation = read_json(&dir.join("generation_config.json"));
    // `<eos>`, and `<end_of_turn>` (106), which ends Gemma's turns.
    assert_eq!(
        generation,
        json!({ "bos_token_id": 2, "eos_token_id": [1, 106] })
    );
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json"));
    assert_eq!(tokenizer_config["add_bos_token"], true);
    assert_eq!(tokenizer_config["bos_token"], "<bos>");
    assert_eq!(tokenizer_config["eos_token"], "<eos>");
    assert!(tokenizer_config.get("chat_template").is_none());
}

fn norms_are_shifted_back_and_projections_are_not_permuted(dir: &Path) {
    let file = GgufFile::open(&gguf_path().unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.tensor("lm_head.weight").is_err());

    // llama.cpp stored `1 + w` in float32; Google's checkpoint is bfloat16, so every imported
    // norm weight must be a bfloat16 value again, while many stored GGUF values are not.
    let (mut norms, mut gguf_not_bf16) = (0usize, 0usize);
    for info in file
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with("norm.weight"))
    {
        let stored = file.dequantize(&info.name).unwrap();
        let hf = match info.name.as_str() {
            "output_norm.weight" => "model.norm.weight".to_owned(),
            name => {
                let (layer, rest) = name["blk.".len()..].split_once('.').unwrap();
                let suffix = match rest {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "post_attention_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
                    "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
                    "attn_q_norm.weight" => "self_attn.q_norm.weight",
                    "attn_k_norm.weight" => "self_attn.k_norm.weight",
                    other => panic!("unexpected norm {other}"),
                };
                format!("model.layers.{layer}.{suffix}")
            }
        };
        let imported = tensor_f32(&st, &hf);
        for (&s, &w) in stored.iter().zip(&imported) {
            assert_eq!(w, s - 1.0, "{hf}");
            assert_eq!(w.to_bits() & 0xffff, 0, "{hf}: {w} is not a bfloat16 value");
            gguf_not_bf16 += usize::from(s.to_bits() & 0xffff != 0);
        }
        norms += imported.len();
    }
    assert_eq!(norms, 55_936);
    assert!(gguf_not_bf16 > 10_000, "{gguf_not_bf16}");

    // q/k rows keep the GGUF order (NeoX-style RoPE in llama.cpp for Gemma).
    for (gguf_name, hf) in [
        (
            "blk.3.attn_q.weight",
            "model.layers.3.self_attn.q_proj.weight",
        ),
        (
            "blk.3.attn_k.weight",
            "model.layers.3.self_attn.k_proj.weight",
        ),
    ] {
        assert_eq!(tensor_f32(&st, hf), file.dequantize(gguf_name).unwrap());
    }
    assert_eq!(
        st.tensor("model.layers.3.self_attn.q_proj.weight")
            .unwrap()
            .shape(),
        [1024, 640]
    );
}

fn tokenizer_matches_the_reference_encodings(dir: &Path) {
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    // (text, ids without special tokens) from transformers' GGUF tokenizer on this file.
    let cases: [(&str, &[u32]); 8] = [
        ("The capital of France is", &[818, 5279, 529, 7001, 563]),
        ("a  b", &[236746, 138, 236763]),
        ("  hello", &[138, 23391]),
        (
            "x                                        y",
            &[236781, 152, 160, 236762],
        ),
        (
            "<start_of_turn>user\nhi<end_of_turn>",
            &[105, 2364, 107, 2202, 106],
        ),
        ("\u{1}\u{7}", &[249732, 245]),
        ("😀 日本語", &[242398, 33375, 238582]),
        (
            "def f():\n\treturn 1",
            &[2063, 517, 6141, 107, 255968, 2060, 236743, 236770],
        ),
    ];
    for (text, ids) in cases {
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(enc.get_ids(), ids, "{text:?}");
        assert_eq!(tok.decode(ids, false).unwrap(), text, "{text:?}");
    }
    // <0x07> is a byte-fallback piece; BOS is added when special tokens are asked for.
    assert_eq!(tok.id_to_token(245).as_deref(), Some("<0x07>"));
    assert_eq!(tok.encode("Hi", true).unwrap().get_ids(), [2, 10979]);
    assert_eq!(
        tok.decode(&[2, 10979, 1], true).unwrap(),
        "Hi",
        "control tokens are special"
    );
}
