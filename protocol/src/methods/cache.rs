//! `cache_list`, `cache_pin`, `cache_fork`, `cache_evict`: the conversations a resident model
//! keeps caches for (named by `generate`'s `cache.conversation_id`), in memory and on disk.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::method;

method!(
    /// `cache_list`: the conversations a model keeps caches for.
    CacheList,
    "cache_list",
    CacheListParams,
    CacheListResult
);

method!(
    /// `cache_pin`: keeps a conversation in memory past the prompt cache's budget, or lets it go.
    CachePin,
    "cache_pin",
    CachePinParams,
    CachePinResult
);

method!(
    /// `cache_fork`: a new conversation starting from a kept one's tokens, sharing its caches.
    CacheFork,
    "cache_fork",
    CacheForkParams,
    CacheForkResult
);

method!(
    /// `cache_evict`: forgets one kept conversation, or all of a model's, in memory and on disk.
    CacheEvict,
    "cache_evict",
    CacheEvictParams,
    CacheEvictResult
);

/// Params of `cache_list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheListParams {
    /// A resident model's id; default the active model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Where a kept conversation's caches are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CacheTier {
    /// In memory (and maybe on disk too).
    Memory,
    /// Only on disk (`--disk-cache-bytes`): read back by the next prompt that shares it.
    Disk,
}

/// One kept conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KeptConversation {
    /// The id `generate` named it by; `null` for a request that named none.
    pub conversation_id: Option<String>,
    /// Tokens its caches hold (the prompt and reply so far).
    pub tokens: u64,
    /// Bytes they take (in memory, or of the file).
    pub bytes: u64,
    /// Where its caches are.
    pub tier: CacheTier,
    /// Kept in memory past the budget (`cache_pin`).
    pub pinned: bool,
}

/// Result of `cache_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CacheListResult {
    /// The model listed.
    pub model_id: String,
    /// In memory (least recently used first), then on disk only.
    pub conversations: Vec<KeptConversation>,
}

/// Params of `cache_pin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CachePinParams {
    /// A resident model's id; default the active model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation (read back into memory if it is only on disk).
    pub conversation_id: String,
    /// `false` unpins; default true.
    #[serde(default = "super::default_true")]
    pub pinned: bool,
}

/// Result of `cache_pin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CachePinResult {
    /// Whether it is pinned now.
    pub pinned: bool,
}

/// Params of `cache_fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheForkParams {
    /// A resident model's id; default the active model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation to start from.
    pub conversation_id: String,
    /// The new conversation's id (not yet kept).
    pub new_conversation_id: String,
    /// How many of its tokens the new one starts with; default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// Result of `cache_fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CacheForkResult {
    /// Tokens the new conversation holds.
    pub tokens: u64,
}

/// Params of `cache_evict`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheEvictParams {
    /// A resident model's id; default the active model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation to forget; absent: every conversation of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
}

/// Result of `cache_evict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CacheEvictResult {
    /// Entries and files removed.
    pub evicted: u64,
}

/// `status`'s `prompt_cache`: what each tier holds and has served since the worker started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PromptCacheInfo {
    /// Prompts looked up (generations that may reuse kept caches).
    pub lookups: u64,
    /// The memory tier (every resident's prompt cache).
    pub memory: CacheTierInfo,
    /// Absent when the disk tier is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTierInfo>,
}

/// A tier: what it holds now and the lookups it served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CacheTierInfo {
    /// Conversations held (on disk: files, every model's).
    pub entries: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// Lookups that reused caches from this tier.
    pub hits: u64,
    /// Prompt tokens those reused.
    pub hit_tokens: u64,
    /// `hits / lookups` (0 before any lookup).
    pub hit_rate: f64,
}

/// The disk tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DiskTierInfo {
    /// What it holds and served, as the memory tier's.
    #[serde(flatten)]
    pub tier: CacheTierInfo,
    /// `--disk-cache-bytes`.
    pub budget_bytes: u64,
    /// Files written by this worker.
    pub writes: u64,
    /// Their bytes.
    pub written_bytes: u64,
    /// Entries dropped instead of written: past the hour's write budget
    /// (`--disk-cache-write-bytes-per-hour`) or larger than the tier.
    pub skipped_writes: u64,
    /// Damaged or foreign files deleted.
    pub rejected: u64,
}
