//! Models for tests: tiny random ones, written here in a few milliseconds from a seed as real
//! Hugging Face model directories that the engine loads and runs like any other, and the place
//! of the real SmolLM2 that `cargo xtask setup` imports ([`smollm2_dir`]).
//!
//! The model is a 2-layer Llama (hidden 64, 4 heads, 2 KV heads, MLP 128) with float32 weights
//! drawn from a seeded xorshift generator. The tokenizer is a byte-level BPE without merges:
//! the special tokens `<|endoftext|>` (0), `<|im_start|>` (1), `<|im_end|>` (2), then one token
//! per byte (byte `b` is id `FIRST_BYTE_ID + b`). The chat template is ChatML; end of sequence
//! is `<|im_end|>`.
//!
//! The projections are drawn with standard deviation `1 / sqrt(fan_in)`, so that the layers,
//! not the (tied) embedding of the last token, decide the next token: greedy decoding wanders
//! instead of repeating its last token forever, and different prompts and seeds give different
//! text. Only the tokens of printable ASCII and newline have non-zero embedding rows; the
//! others (the special tokens, control and non-ASCII bytes) have logit 0 while those of the
//! printable bytes are spread around 0, so greedy decoding never picks one: greedy text is
//! readable ASCII, and a greedy generation runs to `max_new_tokens`, however long. That makes
//! the model a stand-in for long generations (cancellation, `status` while generating) as well
//! as short ones. (Sampling can pick one, rarely: `<|im_end|>` then ends the generation.)

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use safetensors::{tensor::TensorView, Dtype};
use serde_json::{json, Value};
use tokenizers::{
    decoders::byte_level::ByteLevel as ByteLevelDecoder,
    models::bpe::{Vocab, BPE},
    pre_tokenizers::byte_level::ByteLevel,
    AddedToken, Tokenizer,
};

/// The special tokens, at ids 0, 1, 2.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The id of byte 0; byte `b` is token `FIRST_BYTE_ID + b`.
pub const FIRST_BYTE_ID: u32 = SPECIAL_TOKENS.len() as u32;
/// Tokens in the vocabulary: the special tokens and the 256 bytes.
pub const VOCAB_SIZE: usize = SPECIAL_TOKENS.len() + 256;

const LAYERS: usize = 2;
const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const INTERMEDIATE: usize = 128;
/// Half-width of the uniform distribution of the embeddings (standard deviation about 0.02).
const EMBEDDING_RANGE: f32 = 0.035;

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// What to vary between tiny models.
#[derive(Debug, Clone)]
pub struct TinyLlama {
    /// Seeds the weights: the same seed writes the same model.
    pub seed: u64,
    /// `model_type` of config.json; a type the engine does not know (e.g. "mamba") is refused.
    pub model_type: String,
    /// `max_position_embeddings` of config.json (the default context limit).
    pub max_position_embeddings: usize,
}

impl Default for TinyLlama {
    fn default() -> Self {
        Self {
            seed: 0,
            model_type: "llama".into(),
            max_position_embeddings: 4096,
        }
    }
}

/// Writes a tiny random Llama into `dir` (created if missing): config.json,
/// generation_config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
pub fn write_tiny_llama(dir: &Path, spec: &TinyLlama) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_json(&dir.join("config.json"), &config(spec))?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"eos_token_id": 2}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "add_bos_token": false,
            "model_max_length": spec.max_position_embeddings,
            "chat_template": CHATML_TEMPLATE,
        }),
    )?;
    tokenizer()?
        .save(dir.join("tokenizer.json"), false)
        .map_err(io::Error::other)?;
    write_weights(&dir.join("model.safetensors"), spec.seed)
}

/// The directory of the real SmolLM2-135M-Instruct: `MLX_WORKER_SMOLLM2_DIR`, else
/// `$XDG_CACHE_HOME/mlx-worker/models/SmolLM2-135M-Instruct` (`~/.cache` without XDG). `None`
/// when it holds no `model.safetensors`, so that tests can skip; panics instead when
/// `MLX_WORKER_REQUIRE_MODELS=1`, so that CI cannot skip by accident.
pub fn smollm2_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MLX_WORKER_SMOLLM2_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("mlx-worker/models/SmolLM2-135M-Instruct"))
        })?;
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("MLX_WORKER_REQUIRE_MODELS").is_none_or(|v| v != "1"),
        "SmolLM2 is missing at {} and MLX_WORKER_REQUIRE_MODELS=1: run `cargo xtask setup`",
        dir.display()
    );
    eprintln!(
        "skipped: no SmolLM2 at {} (run `cargo xtask setup`)",
        dir.display()
    );
    None
}

/// Serialises tests that run MLX inside one test process. MLX computations from several
/// threads at once (each test thread gets its own CPU stream) can wedge OpenBLAS 0.3.21's
/// thread pool: seen here as a test process hanging at exit in `blas_thread_shutdown_`. The
/// worker itself runs MLX on one thread only.
pub fn mlx_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The GGUF that `cargo xtask setup` imported SmolLM2 from (kept in the cache beside the
/// models), with the same skip-or-fail rule as [`smollm2_dir`].
pub fn smollm2_gguf() -> Option<PathBuf> {
    cached_gguf("MLX_WORKER_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The real Gemma 3 270M GGUF (base model, Q4_K_M) that `cargo xtask setup` fetches:
/// `MLX_WORKER_GEMMA3_GGUF`, else beside SmolLM2's. `None` (or a panic when
/// `MLX_WORKER_REQUIRE_MODELS=1`) when missing, as [`smollm2_dir`].
pub fn gemma3_gguf() -> Option<PathBuf> {
    cached_gguf("MLX_WORKER_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf")
}

/// A GGUF that setup keeps in `<cache>/mlx-worker/gguf/`, or the path in `env`.
fn cached_gguf(env: &str, file: &str) -> Option<PathBuf> {
    let gguf = match std::env::var_os(env) {
        Some(path) => PathBuf::from(path),
        None => smollm2_dir()?.parent()?.parent()?.join("gguf").join(file),
    };
    if gguf.is_file() {
        return Some(gguf);
    }
    assert!(
        std::env::var_os("MLX_WORKER_REQUIRE_MODELS").is_none_or(|v| v != "1"),
        "{} is missing and MLX_WORKER_REQUIRE_MODELS=1: run `cargo xtask setup`",
        gguf.display()
    );
    eprintln!("skipped: no {} (run `cargo xtask setup`)", gguf.display());
    None
}

fn config(spec: &TinyLlama) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": spec.model_type,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": true,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    })
}

fn write_json(path: &Path, value: &Value) -> io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    fs::write(path, text + "\n")
}

/// The byte-level BPE: special tokens, then one token per byte, no merges.
fn tokenizer() -> io::Result<Tokenizer> {
    let vocab: Vocab = SPECIAL_TOKENS
        .iter()
        .map(|t| t.to_string())
        .chain((0..=255u8).map(|b| byte_char(b).to_string()))
        .zip(0u32..)
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .build()
        .map_err(io::Error::other)?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let special: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    // Already in the vocabulary, so they keep ids 0, 1, 2.
    tokenizer.add_special_tokens(&special);
    Ok(tokenizer)
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others take the
/// characters from U+0100 on, in byte order.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("U+0100..U+0143 are characters")
}

/// xorshift64*: a few lines, and the same numbers on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // A zero state would stay zero.
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// Uniform in [-1, 1).
    fn next_unit(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `rows x cols` values uniform in [-range, range).
    fn matrix(&mut self, rows: usize, cols: usize, range: f32) -> Vec<f32> {
        (0..rows * cols).map(|_| self.next_unit() * range).collect()
    }
}

fn write_weights(path: &Path, seed: u64) -> io::Result<()> {
    let mut rng = Rng::new(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut embed = rng.matrix(VOCAB_SIZE, HIDDEN, EMBEDDING_RANGE);
    for (id, row) in embed.chunks_mut(HIDDEN).enumerate() {
        let byte = (id as u32).checked_sub(FIRST_BYTE_ID).map(|b| b as u8);
        if !byte.is_some_and(|b| b == b'\n' || (b' '..=b'~').contains(&b)) {
            row.fill(0.0);
        }
    }
    tensors.push((
        "model.embed_tokens.weight".into(),
        vec![VOCAB_SIZE, HIDDEN],
        embed,
    ));
    let ones = vec![1.0f32; HIDDEN];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        for (name, rows, cols) in [
            ("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM),
            ("mlp.gate_proj", INTERMEDIATE, HIDDEN),
            ("mlp.up_proj", INTERMEDIATE, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ] {
            // Uniform with variance 1 / fan_in.
            let data = rng.matrix(rows, cols, (3.0 / cols as f32).sqrt());
            tensors.push((format!("{p}.{name}.weight"), vec![rows, cols], data));
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            tensors.push((format!("{p}.{norm}.weight"), vec![HIDDEN], ones.clone()));
        }
    }
    tensors.push(("model.norm.weight".into(), vec![HIDDEN], ones));
    write_safetensors(path, tensors)
}

/// How a LoRA adapter is laid out on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterLayout {
    /// `mlx_lm.lora`'s: adapters.safetensors with `lora_a` `(in, r)` / `lora_b` `(r, out)`.
    MlxLm,
    /// PEFT's: adapter_model.safetensors with `lora_A.weight` `(r, in)` / `lora_B.weight` `(out, r)`.
    Peft,
}

/// Rank of the tiny adapters.
const LORA_RANK: usize = 4;
/// Their scale (PEFT: `lora_alpha / r`).
const LORA_SCALE: f32 = 2.0;

/// Writes a LoRA adapter for the tiny Llama into `dir`: q, v and down projections of every
/// layer, rank 4, scale 2. The same seed writes the same numbers in either layout. `base` goes
/// into adapter_config.json as the base model (loading the adapter directory as a model).
pub fn write_tiny_lora(dir: &Path, seed: u64, layout: AdapterLayout, base: &str) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut rng = Rng::new(seed);
    let mut tensors = Vec::new();
    for i in 0..LAYERS {
        for (name, out, inp) in [
            ("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ] {
            let layer = format!("model.layers.{i}.{name}");
            let a = rng.matrix(inp, LORA_RANK, (3.0 / inp as f32).sqrt());
            let b = rng.matrix(LORA_RANK, out, 0.5);
            match layout {
                AdapterLayout::MlxLm => {
                    tensors.push((format!("{layer}.lora_a"), vec![inp, LORA_RANK], a));
                    tensors.push((format!("{layer}.lora_b"), vec![LORA_RANK, out], b));
                }
                AdapterLayout::Peft => {
                    let peft = format!("base_model.model.{layer}");
                    let a_t = transpose(&a, inp, LORA_RANK);
                    let b_t = transpose(&b, LORA_RANK, out);
                    tensors.push((format!("{peft}.lora_A.weight"), vec![LORA_RANK, inp], a_t));
                    tensors.push((format!("{peft}.lora_B.weight"), vec![out, LORA_RANK], b_t));
                }
            }
        }
    }
    let (file, config) = match layout {
        AdapterLayout::MlxLm => (
            "adapters.safetensors",
            json!({
                "model": base,
                "fine_tune_type": "lora",
                "num_layers": LAYERS,
                "lora_parameters": {"rank": LORA_RANK, "scale": LORA_SCALE, "dropout": 0.0},
            }),
        ),
        AdapterLayout::Peft => (
            "adapter_model.safetensors",
            json!({
                "base_model_name_or_path": base,
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": LORA_RANK,
                "lora_alpha": LORA_SCALE * LORA_RANK as f32,
                "lora_dropout": 0.0,
                "target_modules": ["q_proj", "v_proj", "down_proj"],
                "use_rslora": false,
                "use_dora": false,
            }),
        ),
    };
    write_json(&dir.join("adapter_config.json"), &config)?;
    write_safetensors(&dir.join(file), tensors)
}

/// A row-major `rows x cols` matrix transposed.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| m[r * cols + c]))
        .collect()
}

/// Float32 tensors `(name, shape, row-major data)` as a safetensors file.
fn write_safetensors(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> io::Result<()> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(Dtype::F32, shape.clone(), data).map(|view| (name.as_str(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(io::Error::other)?;
    safetensors::serialize_to_file(views, None, path).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_map_to_distinct_characters_and_tokens_round_trip() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        let tokenizer = tokenizer().unwrap();
        let ids = tokenizer
            .encode("<|im_start|>hé", false)
            .unwrap()
            .get_ids()
            .to_vec();
        let e_acute = "é".as_bytes().iter().map(|&b| FIRST_BYTE_ID + u32::from(b));
        let expected: Vec<u32> = [1, FIRST_BYTE_ID + u32::from(b'h')]
            .into_iter()
            .chain(e_acute)
            .collect();
        assert_eq!(ids, expected);
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), "hé");
    }
}
