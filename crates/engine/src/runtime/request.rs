//! What the engine takes and gives back. Plain data, independent of the wire format but for
//! the sampler settings, which are the contract's own `Sampling` (each setting's name, default
//! and range have one home, `protocol/src/methods/sampling.rs`).

pub use model_store::{HfToken, LoadProgress, LoadStage};
pub use protocol::methods::{MemoryPlan, Sampling};
use std::path::PathBuf;

pub use constrain::Constraint;

pub use crate::layers::{
    device::{Backend, DeviceInfo},
    parallel::Parallel,
};

/// Compute dtype for unquantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    Float32,
    Float16,
    Bfloat16,
}

/// A request to make a model resident.
#[derive(Debug, Clone, Default)]
pub struct LoadRequest {
    /// A local model directory (Hugging Face layout), a `.gguf` file, or a Hugging Face repo id
    /// (`org/name`: resolved in the hub cache, downloaded when missing).
    pub model: String,
    /// Hub revision (branch, tag or commit); `None` means "main".
    pub revision: Option<String>,
    /// Hub token for gated or private repos (else `HF_TOKEN`, else the token file).
    pub hf_token: Option<HfToken>,
    /// Context limit; 0 means the model's own.
    pub max_seq_length: usize,
    /// Quantize unquantized weights on load (affine, 4 bits, group 64).
    pub load_in_4bit: bool,
    /// Overrides the config's dtype for unquantized weights.
    pub dtype: Option<WeightDtype>,
    /// A Jinja chat template used instead of the model's.
    pub chat_template_override: Option<String>,
    /// A LoRA adapter (directory or repo id, mlx-lm or PEFT layout) applied on top of `model`.
    /// Without it, a `model` that is itself an adapter directory loads its base model with it.
    pub adapter: Option<String>,
    /// Quantize full-attention KV caches to this many bits (4 or 8; group size 64).
    pub kv_bits: Option<u8>,
    /// A model with the same tokenizer loaded beside it, for [`Speculative::DraftModel`].
    pub draft_model: Option<String>,
    /// Split over the ranks of the worker's group (only when it runs as one).
    pub parallel: Option<Parallel>,
    /// Reload even if resident.
    pub force: bool,
}

impl LoadRequest {
    /// Whether `other` asks for the same resident model: every option that changes what gets
    /// loaded or how it runs is equal (`force` and the token are not such options).
    pub fn same_model_as(&self, other: &LoadRequest) -> bool {
        self.model == other.model
            && self.revision == other.revision
            && self.max_seq_length == other.max_seq_length
            && self.load_in_4bit == other.load_in_4bit
            && self.dtype == other.dtype
            && self.chat_template_override == other.chat_template_override
            && self.adapter == other.adapter
            && self.kv_bits == other.kv_bits
            && self.draft_model == other.draft_model
            && self.parallel == other.parallel
    }
}

/// Quantization of a checkpoint's linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantization {
    pub bits: i32,
    pub group_size: i32,
}

/// What is known about a resident model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_id: String,
    pub path: PathBuf,
    /// Our architecture name, e.g. "llama".
    pub architecture: String,
    /// `model_type` from config.json.
    pub model_type: String,
    pub is_vision: bool,
    pub is_lora: bool,
    pub is_gguf: bool,
    pub dtype: WeightDtype,
    pub quantization: Option<Quantization>,
    pub context_length: usize,
    /// The model's own context, whatever `max_seq_length` asked for.
    pub native_context_length: usize,
    pub num_parameters: u64,
    pub vocab_size: usize,
    pub eos_token_ids: Vec<u32>,
    pub chat_template_present: bool,
    pub chat_template_source: text::ChatTemplateSource,
    /// The chat template's raw text (the one used without tools).
    pub chat_template_text: Option<String>,
    pub special_tokens: text::SpecialTokens,
    /// The last component of `model_id` (a `.gguf` without its extension).
    pub display_name: String,
    /// `kv_bits` as asked for, as applied (`None`: a plain cache), and why they differ.
    pub kv_bits_requested: Option<u8>,
    pub kv_bits: Option<u8>,
    pub kv_bits_reason: Option<String>,
    /// How the model is split over the group's ranks, and what each holds.
    pub parallel: Option<ParallelInfo>,
    /// Layers of the checkpoint's own multi-token-prediction head (0: none).
    pub mtp_layers: usize,
    /// What the load's `draft_model` is, when one was loaded.
    pub draft_kind: Option<DraftKind>,
    /// What `speculative: auto` drafts with (`None`: this model runs one token per pass), and
    /// why.
    pub speculative_auto: (Option<Drafts>, String),
    /// What the model holds and needs in memory, and the context that fits.
    pub memory: MemoryPlan,
}

/// What a load's `draft_model` turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// A smaller model of the same vocabulary.
    Model,
    /// A DFlash block drafter.
    Dflash,
    /// A DFlash2 block drafter (convolutions and a candidate selector).
    Dflash2,
    /// A DSpark block drafter (a Markov head over the block).
    Dspark,
    /// An EAGLE-3 drafter (chaining guesses on the model's hidden states and its own).
    Eagle3,
}

/// A split model: its mode and each rank's share, by rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelInfo {
    pub mode: Parallel,
    pub ranks: Vec<RankShare>,
}

/// What one rank holds of a split model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankShare {
    /// The layers it runs, `[start, end)`.
    pub layers: (usize, usize),
    /// The bytes of the weights it holds.
    pub weight_bytes: u64,
}

/// The worker's group of ranks, when it runs as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// MLX's name of the backend (`ring`, `jaccl`, `nccl`, `mpi`).
    pub backend: String,
    pub size: usize,
    pub rank: usize,
}

/// MLX memory, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    pub active_bytes: u64,
    pub peak_bytes: u64,
    pub limit_bytes: u64,
    pub cache_bytes: u64,
}

/// The prompt: chat messages rendered through the template, plain text, or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Messages rendered with the model's chat template (system prompt already prepended).
    Chat {
        messages: Vec<text::Message>,
        options: text::RenderOptions,
    },
    /// Text encoded as is, with the tokenizer's special tokens (e.g. BOS) added.
    Text(String),
    /// Pre-tokenized ids (parity and benchmarks use these).
    Tokens(Vec<u32>),
}

/// A request to generate a completion.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// A resident model id; `None` means the active (last loaded) model.
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_new_tokens: usize,
    /// The contract's sampler settings, ranges checked by the caller (`Sampling::check`).
    pub sampler: Sampling,
    pub stop: Vec<String>,
    /// When > 0, each delta carries the chosen token's logprob and this many alternatives.
    pub logprobs: usize,
    /// `Some(false)`: generate with the base weights although an adapter is loaded.
    pub use_adapter: Option<bool>,
    /// What the output must be (a JSON schema, a regex, a grammar); `None`: free text.
    pub constraint: Option<Constraint>,
    /// With tools in the prompt's options: whether calls are parsed, or forced.
    pub tool_choice: ToolChoice,
    /// Forced calls: one or more (true), or exactly one.
    pub parallel_tool_calls: bool,
    /// Draft tokens checked in one forward pass; `None`: one token per pass.
    pub speculative: Option<Speculative>,
    /// `false`: nothing of this request is kept for later ones (its KV cache, its image
    /// features); what is kept may still be reused, and is left as it was.
    pub persist: bool,
    /// The conversation the host names this request part of: its kept caches are that
    /// conversation's entry (one per conversation, listed, pinned, forked and evicted by id).
    pub conversation: Option<String>,
}

/// Speculative decoding: where drafts come from, and at most how many per pass (`None`: the
/// method's default, [`Drafts::default_count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculative {
    pub method: Drafts,
    pub num_draft_tokens: Option<usize>,
}

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafts {
    /// The tokens that followed the latest earlier occurrence of the sequence's last n-gram, in
    /// the prompt or the output.
    PromptLookup,
    /// The resident's draft model, decoding greedily ahead.
    DraftModel,
    /// The model's own multi-token-prediction head, chained on its own hidden states.
    Mtp,
    /// The best drafter the resident has ([`Drafts::resolve`]).
    Auto,
}

impl Drafts {
    /// Drafts per pass when the request does not say: 10 (Hugging Face's
    /// `prompt_lookup_num_tokens`); for a multi-token-prediction head of `mtp_depth` layers,
    /// one more than its layers (mlx-vlm's block of `depth + 2` positions, the last the model's).
    pub fn default_count(self, mtp_depth: usize) -> usize {
        match self {
            Self::PromptLookup | Self::DraftModel | Self::Auto => 10,
            Self::Mtp => mtp_depth + 1,
        }
    }

    /// `Auto` made concrete for a resident whose head has `mtp_depth` layers, loaded with a
    /// draft model or not: its own multi-token-prediction head, else the draft model, else
    /// prompt lookup (Studio's order: the built-in head, a companion, copies).
    pub fn resolve(self, mtp_depth: usize, has_draft: bool) -> Self {
        match self {
            Self::Auto if mtp_depth > 0 => Self::Mtp,
            Self::Auto if has_draft => Self::DraftModel,
            Self::Auto => Self::PromptLookup,
            method => method,
        }
    }
}

impl GenerateRequest {
    /// Greedy decoding of `prompt` with the active model and nothing else asked (no stop
    /// strings, logprobs, adapter switch or constraint; greedy sampling takes no filter):
    /// what the parity harness and the engine's tests run.
    pub fn greedy(prompt: Prompt, max_new_tokens: usize) -> Self {
        Self {
            model: None,
            prompt,
            max_new_tokens,
            sampler: Sampling::greedy(),
            stop: Vec::new(),
            logprobs: 0,
            use_adapter: None,
            constraint: None,
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            speculative: None,
            persist: true,
            conversation: None,
        }
    }

    /// The tool definitions the prompt carries (empty without tools).
    pub fn tools(&self) -> &[serde_json::Value] {
        match &self.prompt {
            Prompt::Chat { options, .. } => options.tools.as_deref().unwrap_or_default(),
            _ => &[],
        }
    }
}

/// What a generation with tools does about tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may write calls; they are parsed.
    #[default]
    Auto,
    /// Nothing is parsed.
    None,
    /// The output is one or more calls (constrained to the family's syntax).
    Required,
    /// The output is one or more calls of this tool.
    Function(String),
}

/// One token's log-probabilities, when asked for.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// New text since the last delta.
#[derive(Debug, Clone)]
pub struct Delta {
    pub index: usize,
    pub text: String,
    pub tokens: Vec<TokenLogprob>,
    /// For a model with reasoning markup: which part of the output the text belongs to.
    pub channel: Option<Channel>,
}

/// The part of a reasoning model's output a delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Inside the markup (the markup's own tokens included).
    Reasoning,
    /// The answer.
    Content,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    StopSequence,
    Cancelled,
    /// Ended as `Stop` would, with tool calls in the output.
    ToolCalls,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Images whose encoder output was kept from an earlier request (the tower did not run).
    pub cached_images: usize,
    /// Speculative decoding: tokens drafted, and how many of them the model confirmed.
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// Speculative decoding: prompt positions the drafter's caches held from the prompt cache.
    pub draft_cached_tokens: usize,
}

/// llama-server style timings, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    /// From the start of the request to the first token.
    pub ttft_ms: f64,
}

/// A finished (or cancelled) generation.
#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    /// The tool calls read from `text` (with tools, unless `ToolChoice::None`).
    pub tool_calls: Vec<constrain::ToolCall>,
}

/// What the prompt cache's tiers hold and have served since the engine started (`status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompts looked up (generations that may reuse kept caches).
    pub lookups: u64,
    pub memory: TierStats,
    /// `None` when the disk tier is off.
    pub disk: Option<DiskStats>,
}

/// One tier: what it holds now, and the lookups it served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub hit_tokens: u64,
}

/// The disk tier: as any tier, with its budget and what it wrote, skipped and rejected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub tier: TierStats,
    pub budget_bytes: u64,
    pub counts: crate::runtime::disk_cache::DiskCounts,
}

pub use crate::runtime::prompt_cache::Conversation;
