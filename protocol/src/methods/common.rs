//! Types shared by several methods: memory figures, model info, chat messages.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::SpeculativeMethod;

/// The serde default of the boolean params that default to `true`.
pub(super) fn default_true() -> bool {
    true
}

/// MLX memory figures, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryInfo {
    /// Memory held by live arrays now.
    pub active_bytes: u64,
    /// The most held at once since start (or the last reset of the peak).
    pub peak_bytes: u64,
    /// MLX's memory limit.
    pub limit_bytes: u64,
}

/// A compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// `"bfloat16"`.
    Bfloat16,
    /// `"float16"`.
    Float16,
    /// `"float32"`.
    Float32,
}

/// How a model's weights are quantized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Quantization {
    /// Bits per weight, e.g. 4.
    pub bits: u32,
    /// Weights sharing one scale and bias, e.g. 64.
    pub group_size: u32,
}

/// Where a model's chat template came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ChatTemplateSource {
    /// `chat_template` of `tokenizer_config.json`.
    #[serde(rename = "tokenizer_config")]
    TokenizerConfig,
    /// A `chat_template.jinja` file.
    #[serde(rename = "chat_template.jinja")]
    ChatTemplateJinja,
    /// A `chat_template.json` file (the older place for a separate template).
    #[serde(rename = "chat_template.json")]
    ChatTemplateJson,
    /// The GGUF file's `tokenizer.chat_template`.
    #[serde(rename = "gguf")]
    Gguf,
    /// `chat_template_override` of `load`.
    #[serde(rename = "override")]
    Override,
    /// No template: prompts are the plain concatenation of message contents.
    #[serde(rename = "none")]
    None,
}

/// Whether a model has a chat template, and from where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChatTemplateInfo {
    /// True when a template is in use.
    pub present: bool,
    /// Its origin.
    pub source: ChatTemplateSource,
    /// The template's raw Jinja text (the one used without tools when a model has several);
    /// `null` without a template. Hosts classify a model's capabilities from it.
    pub text: Option<String>,
}

/// The tokenizer's special tokens, as text (`null` when the model has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<String>,
    /// End of sequence.
    pub eos: Option<String>,
    /// Padding.
    pub pad: Option<String>,
}

/// What became of `load`'s `kv_bits`: a model whose attention heads cannot be quantized loads
/// with a plain KV cache, and says why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KvQuantization {
    /// `kv_bits` as asked for; `null` when not asked.
    pub requested: Option<u8>,
    /// The bits the KV cache is quantized to; `null`: a plain cache.
    pub applied: Option<u8>,
    /// Why `applied` differs from `requested`; `null` when they agree.
    pub reason: Option<String>,
}

/// What the worker knows about a loaded model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelInfo {
    /// The model's name for people: the last component of `model` (a `.gguf` without its
    /// extension), e.g. `"SmolLM2-135M-Instruct"`.
    pub display_name: String,
    /// The architecture class of `config.json`, e.g. `"LlamaForCausalLM"`.
    pub architecture: String,
    /// `model_type` of `config.json`, e.g. `"llama"`.
    pub model_type: String,
    /// The model takes images.
    pub is_vision: bool,
    /// A LoRA adapter is applied.
    pub is_lora: bool,
    /// Loaded from a GGUF file.
    pub is_gguf: bool,
    /// The compute dtype.
    pub dtype: Dtype,
    /// The weights' quantization; `null` when unquantized.
    pub quantization: Option<Quantization>,
    /// The context limit in force (tokens).
    pub context_length: u64,
    /// The model's own context (its config's `max_position_embeddings`; 4096 when it names
    /// none), whatever `max_seq_length` asked for.
    pub native_context_length: u64,
    /// Parameter count.
    pub num_parameters: u64,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Tokens that end a generation.
    pub eos_token_ids: Vec<u32>,
    /// The chat template in use.
    pub chat_template: ChatTemplateInfo,
    /// The tokenizer's special tokens.
    pub special_tokens: SpecialTokens,
    /// The KV cache's quantization (`kv_bits`).
    pub kv_quantization: KvQuantization,
    /// How the model is split over the worker's group of ranks; absent when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelInfo>,
    /// Layers of the checkpoint's own multi-token-prediction head, loaded as a drafter for
    /// `speculative: {"method": "mtp"}`; 0: it has none.
    #[serde(default)]
    pub mtp_layers: u32,
    /// What `draft_model` turned out to be, when one was loaded: `"model"` (a smaller model of
    /// the same vocabulary), or a drafter reading this model's hidden states: `"dflash"`,
    /// `"dflash2"`, `"dspark"` or `"eagle3"`; each drafts for `speculative: {"method":
    /// "draft_model"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_kind: Option<DraftKind>,
    /// What `speculative: {"method": "auto"}` drafts with on this model, and why.
    #[serde(default)]
    pub speculative_auto: AutoDrafter,
    /// What the model holds and needs in memory, and whether the context was fitted to it.
    #[serde(default)]
    pub memory: MemoryPlan,
}

/// `load`'s pricing of the model's memory: weights as held, and what a generation filling the
/// context needs beside them, against what MLX's memory limit left when it loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryPlan {
    /// Bytes of the weights as held (the vision tower's and the drafter's with them).
    pub weights_bytes: u64,
    /// Bytes of the KV cache of a generation filling `context_length`, at the KV width.
    pub kv_bytes: u64,
    /// Bytes of the activations of a prefill chunk at the end of the context.
    pub compute_bytes: u64,
    /// Bytes the limit left beside the weights when the model loaded (MLX's limit, less what
    /// other residents held); `null`: no limit known. Kept conversations' caches
    /// (`--prompt-cache-bytes`) do not count: a generation that needs their memory has them
    /// dropped.
    pub available_bytes: Option<u64>,
    /// The context asked for (`max_seq_length`, else the model's own) when `context_length`
    /// was lowered to what fits; `null`: not lowered.
    pub fitted_from: Option<u64>,
    /// Why the context was lowered, or why a generation filling it may not fit; `null` when it
    /// fits.
    pub reason: Option<String>,
}

/// `load`'s answer to which drafter `speculative: {"method": "auto"}` uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AutoDrafter {
    /// The drafter (never `"auto"`); `null` when this model runs one token per pass.
    pub method: Option<SpeculativeMethod>,
    /// Why, in words a host can show.
    pub reason: String,
}

/// What a load's `draft_model` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DraftKind {
    /// A smaller model of the same vocabulary, decoding ahead.
    Model,
    /// A DFlash block drafter.
    Dflash,
    /// A DFlash2 block drafter (DFlash with convolutions and a candidate selector).
    Dflash2,
    /// A DSpark block drafter (DFlash with a Markov head chaining its guesses).
    Dspark,
    /// An EAGLE-3 drafter (speculators format), chaining guesses on the model's hidden states.
    Eagle3,
}

/// How a model is split over the ranks of a group (`load`'s `parallel`; mlx-lm's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParallelMode {
    /// Every rank holds all layers with a share of each one's attention heads and MLP columns.
    Tensor,
    /// Every rank holds a run of whole layers; activations pass from rank to rank.
    Pipeline,
}

/// A split model: the mode and what each rank holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ParallelInfo {
    /// How it is split.
    pub mode: ParallelMode,
    /// Each rank's share, by rank.
    pub ranks: Vec<RankShare>,
}

/// What one rank holds of a split model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RankShare {
    /// The rank.
    pub rank: u32,
    /// The layers it runs: `[start, end)`.
    pub layers: [u64; 2],
    /// Bytes of the weights it holds (its linear layers and embedding).
    pub weight_bytes: u64,
}

/// The worker's group of ranks (started by `mlx.launch` or `cargo xtask launch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GroupInfo {
    /// MLX's distributed backend: `ring`, `jaccl`, `nccl` or `mpi`.
    pub backend: String,
    /// Number of ranks.
    pub size: u32,
    /// This process's rank (the one that speaks JSON-RPC is 0).
    pub rank: u32,
}

/// One chat message: `{role, content}`.
///
/// Members other than `role` and `content` (e.g. `tool_calls`, `name`) are kept in `extra` and
/// passed to the chat template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`, or what the template knows.
    pub role: String,
    /// A string, or a list of text and image parts.
    pub content: MessageContent,
    /// Other members, passed to the chat template unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with plain-text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: MessageContent::Text(content.into()),
            extra: Map::new(),
        }
    }
}

/// The `content` of a [`ChatMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// A list of parts.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part [`MessageContent`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// `{type: "text", text}`.
    Text {
        /// The text.
        text: String,
    },
    /// `{type: "image", image}`: base64, a data URL or a local path.
    Image {
        /// The image.
        image: String,
    },
    /// OpenAI's `{type: "image_url", image_url: {url}}`: a data URL or a local path.
    ImageUrl {
        /// Where the image is.
        image_url: ImageUrl,
    },
}

/// The `image_url` member of an OpenAI image part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImageUrl {
    /// A data URL (`data:image/png;base64,...`), base64 or a local path; `http(s)` URLs are
    /// refused (the worker does not fetch).
    pub url: String,
}
