//! Checks against the real SmolLM2-135M-Instruct GGUF (see /work/shared/models.md).
//!
//! The file comes from `cargo xtask setup` (cached under `$XDG_CACHE_HOME` or `~/.cache`, in
//! `mlx-worker/gguf/`) or from `MLX_WORKER_SMOLLM2_GGUF`. Without it these tests print a note
//! and pass, unless `MLX_WORKER_REQUIRE_MODELS=1`, which makes a missing file a failure.

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile};
use safetensors::SafeTensors;
use serde_json::Value;
use tokenizers::Tokenizer;

mod common;

const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn gguf_path() -> Option<PathBuf> {
    common::real_gguf("MLX_WORKER_SMOLLM2_GGUF", FILE_NAME)
}

/// The checkpoint imported once, into a temporary directory that goes when the test ends;
/// each check below reads it in turn.
#[test]
fn imported_checkpoint() {
    let Some(gguf) = gguf_path() else { return };
    let dir = common::import(&gguf, |report| {
        assert_eq!(report.architecture, "llama");
        assert!(report.tied_embeddings);
        assert_eq!(report.tensors_written, 2 + 30 * 9);
    });
    config_matches_the_model_card(dir.path());
    safetensors_hold_hf_names_shapes_and_gguf_values(dir.path());
    tokenizer_follows_gguf_semantics(dir.path());
    chat_template_renders_to_chatml_with_special_ids(dir.path());
}

use common::read_json;

#[test]
fn metadata_and_tensor_table() {
    let Some(path) = gguf_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.architecture().unwrap(), "llama");
    assert!(matches!(file.version(), 2 | 3));
    assert_eq!(file.require::<u64>("llama.block_count").unwrap(), 30);
    assert_eq!(file.require::<u64>("llama.embedding_length").unwrap(), 576);
    assert_eq!(
        file.require::<u64>("llama.feed_forward_length").unwrap(),
        1536
    );
    assert_eq!(
        file.require::<u64>("llama.attention.head_count").unwrap(),
        9
    );
    assert_eq!(
        file.require::<u64>("llama.attention.head_count_kv")
            .unwrap(),
        3
    );
    assert_eq!(file.require::<u64>("llama.context_length").unwrap(), 8192);
    assert_eq!(
        file.require::<Vec<String>>("tokenizer.ggml.tokens")
            .unwrap()
            .len(),
        49152
    );
    assert_eq!(
        file.require::<Vec<String>>("tokenizer.ggml.merges")
            .unwrap()
            .len(),
        48900
    );

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.shape(), [49152, 576]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(
        file.tensor("blk.0.attn_q.weight").unwrap().ggml_type,
        GgmlType::Q4_1
    );
    assert_eq!(
        file.tensor("blk.0.attn_k.weight").unwrap().shape(),
        [192, 576]
    );
    assert_eq!(
        file.tensor("output_norm.weight").unwrap().ggml_type,
        GgmlType::F32
    );
    assert!(file.tensor("output.weight").is_none());
}

fn config_matches_the_model_card(dir: &Path) {
    let config = read_json(&dir.join("config.json"));
    let expect = [
        ("model_type", Value::from("llama")),
        ("hidden_size", 576.into()),
        ("intermediate_size", 1536.into()),
        ("num_hidden_layers", 30.into()),
        ("num_attention_heads", 9.into()),
        ("num_key_value_heads", 3.into()),
        ("head_dim", 64.into()),
        ("rms_norm_eps", 1e-5.into()),
        ("rope_theta", 100000.0.into()),
        ("max_position_embeddings", 8192.into()),
        ("vocab_size", 49152.into()),
        ("tie_word_embeddings", true.into()),
        ("bos_token_id", 1.into()),
        ("eos_token_id", 2.into()),
        ("torch_dtype", "float32".into()),
    ];
    for (key, value) in expect {
        assert_eq!(config[key], value, "config.json {key}");
    }
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");

    let tok_config = read_json(&dir.join("tokenizer_config.json"));
    assert_eq!(tok_config["bos_token"], "<|im_start|>");
    assert_eq!(tok_config["eos_token"], "<|im_end|>");
    assert_eq!(tok_config["pad_token"], "<|im_end|>");
    assert_eq!(tok_config["add_bos_token"], false);
    assert!(tok_config["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    let gen = read_json(&dir.join("generation_config.json"));
    assert_eq!(
        (gen["bos_token_id"].clone(), gen["eos_token_id"].clone()),
        (1.into(), 2.into())
    );
}

fn safetensors_hold_hf_names_shapes_and_gguf_values(dir: &Path) {
    let gguf = GgufFile::open(&gguf_path().unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 272);
    assert!(
        st.tensor("lm_head.weight").is_err(),
        "tied model must not carry lm_head"
    );
    let shape = |name: &str| st.tensor(name).unwrap().shape().to_vec();
    assert_eq!(shape("model.embed_tokens.weight"), [49152, 576]);
    assert_eq!(shape("model.layers.29.self_attn.q_proj.weight"), [576, 576]);
    assert_eq!(shape("model.layers.0.self_attn.k_proj.weight"), [192, 576]);
    assert_eq!(shape("model.layers.0.self_attn.v_proj.weight"), [192, 576]);
    assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), [1536, 576]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [576, 1536]);
    assert_eq!(shape("model.norm.weight"), [576]);

    let floats = |name: &str| -> Vec<f32> {
        assert_eq!(st.tensor(name).unwrap().dtype(), safetensors::Dtype::F32);
        common::tensor_f32(&st, name)
    };
    // Unquantized tensors pass through bit for bit.
    let raw_norm: Vec<f32> = gguf
        .tensor_data(gguf.tensor("blk.3.ffn_norm.weight").unwrap())
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        floats("model.layers.3.post_attention_layernorm.weight"),
        raw_norm
    );
    // v is not permuted: row-major dequantized values as they are.
    assert_eq!(
        floats("model.layers.0.self_attn.v_proj.weight"),
        gguf.dequantize("blk.0.attn_v.weight").unwrap()
    );
    // k is permuted within each of the 3 heads: same rows, another order.
    let k_hf = floats("model.layers.0.self_attn.k_proj.weight");
    let k_gguf = gguf.dequantize("blk.0.attn_k.weight").unwrap();
    assert_ne!(k_hf, k_gguf);
    let row = |v: &[f32], r: usize| v[r * 576..(r + 1) * 576].to_vec();
    assert_eq!(row(&k_hf, 64 + 1), row(&k_gguf, 64 + 2)); // head 1, i = 1, first half
    assert_eq!(row(&k_hf, 64 + 32), row(&k_gguf, 64 + 1)); // head 1, i = 0, second half
    assert!(floats("model.embed_tokens.weight")
        .iter()
        .all(|v| v.is_finite()));
}

fn vocab_id(file: &GgufFile, token: &str) -> u32 {
    let tokens: Vec<String> = file.require("tokenizer.ggml.tokens").unwrap();
    tokens.iter().position(|t| t == token).unwrap() as u32
}

fn tokenizer_follows_gguf_semantics(dir: &Path) {
    let gguf = GgufFile::open(&gguf_path().unwrap()).unwrap();
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();

    let text = "What is the capital of France? 12345";
    let enc = tok.encode(text, false).unwrap();
    let ids = enc.get_ids();
    assert_eq!(tok.decode(ids, false).unwrap(), text);
    // smollm pre-tokenizer: every digit its own token.
    let digits: Vec<u32> = "12345"
        .chars()
        .map(|c| vocab_id(&gguf, &c.to_string()))
        .collect();
    assert_eq!(&ids[ids.len() - 5..], digits);
    // Byte-level BPE: a leading space is part of the word ("Ġcapital").
    assert!(ids.contains(&vocab_id(&gguf, "Ġcapital")));
    assert_eq!(
        tok.encode("What is", false).unwrap().get_ids(),
        [vocab_id(&gguf, "What"), vocab_id(&gguf, "Ġis")]
    );

    for (special, id) in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)] {
        assert_eq!(
            tok.encode(special, false).unwrap().get_ids(),
            [id],
            "{special}"
        );
        assert_eq!(tok.token_to_id(special), Some(id));
    }
    // add_bos_token is false: encoding with special tokens adds nothing.
    assert_eq!(
        tok.encode("Hi", true).unwrap().get_ids(),
        tok.encode("Hi", false).unwrap().get_ids()
    );
}

fn chat_template_renders_to_chatml_with_special_ids(dir: &Path) {
    let config = read_json(&dir.join("tokenizer_config.json"));
    let template = config["chat_template"].as_str().unwrap();
    let mut env = minijinja::Environment::new();
    env.add_template("chat", template).unwrap();
    let rendered = env
        .get_template("chat")
        .unwrap()
        .render(minijinja::context! {
            messages => vec![minijinja::context! { role => "user", content => "What is the capital of France?" }],
            add_generation_prompt => true,
        })
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let ids = tok
        .encode(rendered.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
    assert_eq!(tok.decode(&ids, false).unwrap(), rendered);
}
