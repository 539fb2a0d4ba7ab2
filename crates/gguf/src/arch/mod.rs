//! Per-architecture knowledge: GGUF hyperparameters to `config.json`, GGUF tensor names to
//! Hugging Face names, and the layout fixes a tensor needs on the way.
//!
//! Adding an architecture means a new file beside `llama.rs` with the same three functions (its
//! block tables built from the shared parts below), a variant in [`Architecture`] and its
//! `ALL`, and a `gguf` parity fixture (`xtask/parity/gguf_fixture.py`) proving the round trip.

mod gemma3;
mod glm4_moe;
mod gpt_oss;
mod lfm2;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use serde_json::{json, Map, Value};

use crate::{GgufError, GgufFile, ImportError};

/// An architecture the importer can convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Architecture {
    Llama,
    Gemma3,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Phi3,
    GptOss,
    Lfm2,
    Glm4Moe,
}

/// The `general.architecture` names the importer converts, for messages.
pub(crate) fn supported_names() -> String {
    Architecture::ALL.map(Architecture::name).join(", ")
}

/// What to do to a tensor's rows between dequantizing and writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transform {
    /// Write as dequantized.
    None,
    /// Undo llama.cpp's rotary row interleave of a q/k projection with this many heads.
    UnpermuteHeads(usize),
    /// `(channels, kernel)` as Hugging Face's convolution layout `(channels, 1, kernel)`: the
    /// same values, another shape (LFM2's short convolutions, which llama.cpp squeezes).
    AddChannelAxis,
    /// Subtract 1 from every value: llama.cpp stores Gemma's RMSNorm weights as `1 + w`, while
    /// Hugging Face (and mlx-lm) store `w` and compute `x * (1 + w)`.
    SubtractOne,
    /// Not written: a part of the file the model does not run (GLM-4 MoE's
    /// multi-token-prediction layer, which mlx-lm drops too).
    Drop,
}

/// A tensor's destination in the Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorTarget {
    pub hf_name: String,
    pub transform: Transform,
}

impl Architecture {
    /// Every architecture the importer converts.
    pub const ALL: [Self; 9] = [
        Self::Llama,
        Self::Gemma3,
        Self::Qwen2,
        Self::Qwen3,
        Self::Qwen3Moe,
        Self::Phi3,
        Self::GptOss,
        Self::Lfm2,
        Self::Glm4Moe,
    ];

    /// The architecture named by `general.architecture`.
    pub fn of(file: &GgufFile) -> Result<Self, ImportError> {
        let name = file.architecture()?;
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| ImportError::UnsupportedArchitecture(name.to_owned()))
    }

    /// `general.architecture`, also the GGUF metadata key prefix (`llama.` ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Gemma3 => "gemma3",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Phi3 => "phi3",
            Self::GptOss => "gpt-oss",
            Self::Lfm2 => "lfm2",
            Self::Glm4Moe => "glm4moe",
        }
    }

    /// Hyperparameters read from the metadata.
    pub fn hyperparameters(self, file: &GgufFile) -> Result<Hyperparameters, ImportError> {
        let mut hp = Hyperparameters::read(file, self.name())?;
        // A list of one count for every layer is the same as one count; an uneven one means
        // layers of kinds only LFM2's mapping knows.
        let uneven = (hp.kv_heads_per_layer.as_ref())
            .is_some_and(|per_layer| per_layer.iter().any(|&n| n != hp.num_kv_heads));
        if uneven && self != Self::Lfm2 {
            return Err(ImportError::Inconsistent(format!(
                "{}.attention.head_count_kv differs from layer to layer, which this \
                 architecture's import does not support",
                self.name()
            )));
        }
        match self {
            Self::Qwen3Moe | Self::GptOss => check_experts(&hp, self.name())?,
            Self::Llama => {
                if hp.experts.is_some() {
                    // Mixtral.
                    check_experts(&hp, self.name())?;
                }
                hp.llama3_rope = llama::llama3_rope(file, &hp)?;
            }
            Self::Glm4Moe => {
                check_experts(&hp, self.name())?;
                // llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`, which mlx-lm's glm4_moe
                // always runs.
                if hp.expert_gating_func.is_some_and(|f| f != 2) {
                    return Err(ImportError::Inconsistent(
                        "glm4moe.expert_gating_func is not sigmoid (2), the only routing \
                         GLM-4 MoE has"
                            .into(),
                    ));
                }
                if hp.nextn_layers >= hp.num_layers {
                    return Err(ImportError::Inconsistent(format!(
                        "glm4moe.nextn_predict_layers ({}) leaves none of the {} blocks to the \
                         model",
                        hp.nextn_layers, hp.num_layers
                    )));
                }
                // block_count counts the multi-token-prediction layers, which are dropped:
                // the first of them must be one (`nextn.eh_proj`), not a layer of the model.
                hp.num_layers -= hp.nextn_layers;
                let first = format!("blk.{}.nextn.eh_proj.weight", hp.num_layers);
                if hp.nextn_layers > 0 && file.tensor(&first).is_none() {
                    return Err(ImportError::Inconsistent(format!(
                        "glm4moe.nextn_predict_layers says the last {} block(s) predict ahead, \
                         but the file has no {first}",
                        hp.nextn_layers
                    )));
                }
                hp.attention_bias = file.tensor("blk.0.attn_q.bias").is_some();
                hp.qk_norm = file.tensor("blk.0.attn_q_norm.weight").is_some();
            }
            Self::Lfm2 => match (&hp.kv_heads_per_layer, hp.short_conv_cache) {
                (Some(per_layer), Some(_)) if per_layer.len() == hp.num_layers => {}
                _ => {
                    return Err(ImportError::Inconsistent(
                        "lfm2 needs lfm2.attention.head_count_kv as a list of one count per \
                         layer (0 for a convolution layer) and lfm2.shortconv.l_cache"
                            .into(),
                    ))
                }
            },
            _ => {}
        }
        Ok(hp)
    }

    /// The architecture-specific part of `config.json`.
    pub fn config(self, hp: &Hyperparameters) -> Map<String, Value> {
        match self {
            Self::Llama => llama::config(hp),
            Self::Gemma3 => gemma3::config(hp),
            Self::Qwen2 => qwen2::config(hp),
            Self::Qwen3 => qwen3::config(hp),
            Self::Qwen3Moe => qwen3_moe::config(hp),
            Self::Phi3 => phi3::config(hp),
            Self::GptOss => gpt_oss::config(hp),
            Self::Lfm2 => lfm2::config(hp),
            Self::Glm4Moe => glm4_moe::config(hp),
        }
    }

    /// Where a GGUF tensor goes, or `None` if the architecture has no place for it: renamed by
    /// the block table, values changed on the way only for Llama's q/k and Gemma's norms.
    pub fn target(self, gguf_name: &str, hp: &Hyperparameters) -> Option<TensorTarget> {
        match self {
            Self::Llama => llama::target(gguf_name, hp),
            Self::Gemma3 => gemma3::target(gguf_name, hp),
            Self::Lfm2 => lfm2::target(gguf_name, hp),
            Self::Glm4Moe => glm4_moe::target(gguf_name, hp),
            _ => renamed(gguf_name, hp, self.block(hp)),
        }
    }

    /// The Hugging Face tensors a complete checkpoint has (without the output head).
    pub fn required_tensors(self, hp: &Hyperparameters) -> Vec<String> {
        match self {
            Self::Lfm2 => lfm2::required_tensors(hp),
            Self::Glm4Moe => glm4_moe::required_tensors(hp),
            _ => required_names(hp.num_layers, self.block(hp)),
        }
    }

    /// The GGUF block tensors of one layer and their Hugging Face names.
    fn block(self, hp: &Hyperparameters) -> &'static [&'static BlockTable] {
        match self {
            Self::Llama => llama::block(hp),
            Self::Gemma3 => &gemma3::BLOCK,
            Self::Qwen2 => &qwen2::BLOCK,
            Self::Qwen3 => &qwen3::BLOCK,
            Self::Qwen3Moe => &qwen3_moe::BLOCK,
            Self::Phi3 => &phi3::BLOCK,
            Self::GptOss => &gpt_oss::BLOCK,
            // Their layers differ: their `target` and `required_tensors` choose per layer.
            Self::Lfm2 | Self::Glm4Moe => &[],
        }
    }
}

/// The hyperparameters llama-family GGUFs store under `<arch>.*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Hyperparameters {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: usize,
    /// `<arch>.attention.sliding_window`, for architectures with local attention layers.
    pub sliding_window: Option<usize>,
    /// `<arch>.rope.freq_base_swa`: the RoPE base of the sliding-window layers, when stored.
    pub rope_theta_swa: Option<f64>,
    /// `<arch>.rope.scaling.type` and `.factor`, when the file has them.
    pub rope_scaling: Option<(String, f64)>,
    /// `<arch>.rope.dimension_count`: the rotated features of a head, when stored.
    pub rope_dimensions: Option<usize>,
    /// `<arch>.rope.scaling.original_context_length`, when stored.
    pub original_context_length: Option<usize>,
    /// `<arch>.expert_count`, `.expert_used_count`, `.expert_feed_forward_length`, for
    /// mixtures of experts.
    pub experts: Option<Experts>,
    /// `<arch>.attention.head_count_kv` when it is a list, one count per layer (0: the layer
    /// does not attend; LFM2's convolution layers).
    pub kv_heads_per_layer: Option<Vec<usize>>,
    /// `<arch>.shortconv.l_cache`: a short convolution's taps (LFM2).
    pub short_conv_cache: Option<usize>,
    /// `<arch>.expert_shared_count`, `.leading_dense_block_count`, `.expert_weights_scale`,
    /// `.expert_gating_func` (GLM-4 MoE).
    pub shared_experts: Option<usize>,
    pub leading_dense_blocks: Option<usize>,
    pub expert_weights_scale: Option<f64>,
    pub expert_gating_func: Option<u32>,
    /// `<arch>.nextn_predict_layers`: multi-token-prediction blocks after the model's
    /// (GLM-4 MoE; `num_layers` excludes them once the architecture has read them).
    pub nextn_layers: usize,
    /// What the tensors say where the metadata does not (GLM-4 MoE): q/k/v biases, q/k norms.
    pub attention_bias: bool,
    pub qk_norm: bool,
    /// Llama 3's RoPE scaling, recovered from the `rope_freqs.weight` factors (`llama`).
    pub llama3_rope: Option<llama::Llama3Rope>,
}

/// A mixture of experts' sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Experts {
    pub count: usize,
    pub used: usize,
    pub feed_forward_length: usize,
    /// `<arch>.expert_weights_norm`: whether the top-k weights are renormalized, when stored.
    pub normalize: Option<bool>,
}

impl Hyperparameters {
    fn read(file: &GgufFile, arch: &str) -> Result<Self, ImportError> {
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size: usize = file.require(&key("embedding_length"))?;
        let num_heads: usize = file.require(&key("attention.head_count"))?;
        if num_heads == 0 || hidden_size == 0 {
            return Err(ImportError::Inconsistent(format!(
                "{arch}.embedding_length and {arch}.attention.head_count must be positive"
            )));
        }
        let head_dim = file
            .get_as(&key("attention.key_length"))?
            .unwrap_or(hidden_size / num_heads);
        let intermediate_size = file.require(&key("feed_forward_length"))?;
        // Hybrids store a KV head count per layer; the attending layers' is the model's.
        let kv_key = key("attention.head_count_kv");
        let kv_heads_per_layer: Option<Vec<usize>> = match file.get(&kv_key) {
            Some(crate::MetadataValue::Array(_)) => Some(file.require(&kv_key)?),
            _ => None,
        };
        let num_kv_heads = match &kv_heads_per_layer {
            Some(per_layer) => per_layer.iter().copied().max().unwrap_or(0),
            None => file.get_as(&kv_key)?.unwrap_or(num_heads),
        };
        Ok(Self {
            hidden_size,
            intermediate_size,
            num_layers: file.require(&key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f32_value(file, &key("attention.layer_norm_rms_epsilon"))?
                .ok_or_else(|| GgufError::MissingKey(key("attention.layer_norm_rms_epsilon")))?,
            rope_theta: f32_value(file, &key("rope.freq_base"))?.unwrap_or(10_000.0),
            context_length: file.require(&key("context_length"))?,
            sliding_window: file.get_as(&key("attention.sliding_window"))?,
            rope_theta_swa: f32_value(file, &key("rope.freq_base_swa"))?,
            rope_scaling: match file.get_as::<String>(&key("rope.scaling.type"))? {
                Some(kind) if kind != "none" => Some((
                    kind,
                    f32_value(file, &key("rope.scaling.factor"))?
                        .ok_or_else(|| GgufError::MissingKey(key("rope.scaling.factor")))?,
                )),
                _ => None,
            },
            rope_dimensions: file.get_as(&key("rope.dimension_count"))?,
            original_context_length: file.get_as(&key("rope.scaling.original_context_length"))?,
            experts: match file.get_as::<usize>(&key("expert_count"))? {
                // Mixtral files (as `llama`) have no expert_feed_forward_length: the experts
                // are feed_forward_length wide.
                Some(count) if count > 0 => Some(Experts {
                    count,
                    used: file.require(&key("expert_used_count"))?,
                    feed_forward_length: file
                        .get_as(&key("expert_feed_forward_length"))?
                        .unwrap_or(intermediate_size),
                    normalize: file.get_as(&key("expert_weights_norm"))?,
                }),
                _ => None,
            },
            kv_heads_per_layer,
            short_conv_cache: file.get_as(&key("shortconv.l_cache"))?,
            shared_experts: file.get_as(&key("expert_shared_count"))?,
            leading_dense_blocks: file.get_as(&key("leading_dense_block_count"))?,
            expert_weights_scale: f32_value(file, &key("expert_weights_scale"))?,
            expert_gating_func: file.get_as(&key("expert_gating_func"))?,
            nextn_layers: file.get_as(&key("nextn_predict_layers"))?.unwrap_or(0),
            attention_bias: false,
            qk_norm: false,
            llama3_rope: None,
        })
    }
}

/// A float metadata value as the shortest decimal that round-trips its stored precision, so
/// an f32 `1e-5` lands in JSON as `1e-05`, not `9.999999747378752e-06`.
fn f32_value(file: &GgufFile, key: &str) -> Result<Option<f64>, GgufError> {
    Ok(match file.get(key) {
        Some(crate::MetadataValue::F32(v)) => {
            Some(v.to_string().parse().expect("f32 display parses as f64"))
        }
        _ => file.get_as::<f64>(key)?,
    })
}

/// The top-level tensors every llama-style architecture shares, by GGUF name.
const TOP_LEVEL_TENSORS: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// GGUF block tensor suffix -> Hugging Face suffix under `model.layers.N.`, in parts that the
/// architectures combine.
type BlockTable = [(&'static str, &'static str)];

/// The attention projections (llama.cpp's `attn_q` ... `attn_output`).
const ATTENTION: [(&str, &str); 4] = [
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
];

/// The SwiGLU MLP's three projections.
const DENSE_MLP: [(&str, &str); 3] = [
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// The two pre-norms of a Llama block (llama.cpp's `ffn_norm` is Hugging Face's
/// `post_attention_layernorm`: after attention, before the MLP).
const PRE_NORMS: [(&str, &str); 2] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
];

/// Per-head RMSNorms of queries and keys (Qwen3, Gemma 3).
const QK_NORMS: [(&str, &str); 2] = [
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
];

/// The Hugging Face name of `gguf_name`: a top-level tensor, or `blk.N.<suffix>` with `suffix`
/// in one of `tables` and `N < num_layers`.
/// Also returns the GGUF suffix (the whole name for top-level tensors), which decides the
/// transform.
fn hf_name<'a>(
    gguf_name: &'a str,
    num_layers: usize,
    tables: &[&BlockTable],
) -> Option<(String, &'a str)> {
    if let Some((_, hf)) = TOP_LEVEL_TENSORS.iter().find(|(g, _)| *g == gguf_name) {
        return Some(((*hf).to_owned(), gguf_name));
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|&l| l < num_layers)?;
    let (_, hf_suffix) = tables
        .iter()
        .flat_map(|t| t.iter())
        .find(|(g, _)| *g == suffix)?;
    Some((format!("model.layers.{layer}.{hf_suffix}"), suffix))
}

/// Where a GGUF tensor goes when the architecture changes no values on the way (the
/// architectures llama.cpp runs with NeoX-style RoPE, whose q/k rows are not regrouped).
pub(super) fn renamed(
    gguf_name: &str,
    hp: &Hyperparameters,
    tables: &[&BlockTable],
) -> Option<TensorTarget> {
    let (hf_name, _) = hf_name(gguf_name, hp.num_layers, tables)?;
    Some(TensorTarget {
        hf_name,
        transform: Transform::None,
    })
}

/// Embedding, final norm and every block tensor of `tables` for `num_layers` layers.
fn required_names(num_layers: usize, tables: &[&BlockTable]) -> Vec<String> {
    let mut names = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".to_owned(),
    ];
    for layer in 0..num_layers {
        for (_, hf_suffix) in tables.iter().flat_map(|t| t.iter()) {
            names.push(format!("model.layers.{layer}.{hf_suffix}"));
        }
    }
    names
}

/// The `config.json` keys every llama-style architecture writes the same way, after the
/// architecture's own `head` keys (architectures, model_type, ...).
fn config_with(head: Value, hp: &Hyperparameters) -> Map<String, Value> {
    let mut map = object(head);
    map.extend(object(json!({
        "hidden_size": hp.hidden_size,
        "intermediate_size": hp.intermediate_size,
        "num_hidden_layers": hp.num_layers,
        "num_attention_heads": hp.num_heads,
        "num_key_value_heads": hp.num_kv_heads,
        "head_dim": hp.head_dim,
        "rms_norm_eps": hp.rms_norm_eps,
        "rope_theta": hp.rope_theta,
        "max_position_embeddings": hp.context_length,
    })));
    map
}

/// Mixtures of experts need `<arch>.expert_count` and `.expert_used_count`, with
/// `0 < used <= count`.
fn check_experts(hp: &Hyperparameters, arch: &str) -> Result<(), ImportError> {
    match hp.experts {
        Some(e) if e.used > 0 && e.used <= e.count => Ok(()),
        _ => Err(ImportError::Inconsistent(format!(
            "{arch}.expert_count and {arch}.expert_used_count must be given, with 0 < used <= count"
        ))),
    }
}

/// `rope_scaling` for config.json: `{rope_type, factor}` (and the original context, when the
/// file gives it) when the file names a scaling, else null.
fn rope_scaling(hp: &Hyperparameters) -> Value {
    let Some((kind, factor)) = &hp.rope_scaling else {
        return Value::Null;
    };
    let mut scaling = object(json!({ "rope_type": kind, "factor": factor }));
    if let Some(original) = hp.original_context_length {
        scaling.insert("original_max_position_embeddings".into(), json!(original));
    }
    Value::Object(scaling)
}

/// A `json!` object literal as a map.
fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object literal"),
    }
}
