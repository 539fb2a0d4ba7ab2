//! `generate`: one chat completion, streamed as `generate/delta` notifications.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{default_true, notification, ChatMessage, Method, Sampling};
use crate::envelope::RequestId;
use crate::error::ResponseError;
use crate::params::with_defaults;

/// `generate`: runs one completion; deltas stream while it runs.
#[derive(Debug, Clone, Copy)]
pub enum Generate {}

impl Method for Generate {
    const NAME: &'static str = "generate";
    type Params = GenerateParams;
    type Result = GenerateResult;

    /// The one check of the sampler settings that produces a wire error; the engine's sampler
    /// only asserts what is checked here (it cannot name a field to the host).
    fn validate(p: &GenerateParams) -> Result<(), ResponseError> {
        let bad = |field: &str, reason: String| Err(ResponseError::invalid_params(field, reason));
        match &p.prompt_ids {
            Some(ids) if ids.is_empty() => {
                return bad("prompt_ids", "must hold at least one token id".into());
            }
            Some(_) if !p.messages.is_empty() => {
                return bad(
                    "messages",
                    "must be empty when `prompt_ids` is the prompt".into(),
                );
            }
            Some(_) => {
                // A raw prompt has no template: a template input would be silently dropped.
                let template_inputs = [
                    ("image", p.image.is_some()),
                    ("system_prompt", !p.system_prompt.is_empty()),
                    ("tools", p.tools.is_some()),
                    ("tool_choice", p.tool_choice.is_some()),
                    ("enable_thinking", p.enable_thinking.is_some()),
                    ("reasoning_effort", p.reasoning_effort.is_some()),
                    ("preserve_thinking", p.preserve_thinking.is_some()),
                    ("continue_final_message", p.continue_final_message),
                    ("add_generation_prompt", !p.add_generation_prompt),
                ];
                if let Some((field, _)) = template_inputs.iter().find(|(_, given)| *given) {
                    return bad(
                        field,
                        "a raw prompt (`prompt_ids`) has no chat template: leave it out".into(),
                    );
                }
            }
            None if p.messages.is_empty() => {
                return bad("messages", "must hold at least one message".into());
            }
            None => {}
        }
        p.sampling.check()?;
        let drafts = p.speculative.as_ref().and_then(|s| s.num_draft_tokens);
        if let Some(n) = drafts.filter(|n| !(1..=64).contains(n)) {
            return bad(
                "speculative.num_draft_tokens",
                format!("must be in 1..=64, not {n}"),
            );
        }
        let forced = match &p.tool_choice {
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) => Some(None),
            Some(ToolChoice::Function(f)) => Some(Some(f.function.name.as_str())),
            _ => None,
        };
        if let Some(only) = forced {
            let names: Vec<&str> = match &p.tools {
                Some(Value::Array(tools)) => tools
                    .iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .collect(),
                _ => Vec::new(),
            };
            if names.is_empty() {
                return bad(
                    "tool_choice",
                    "needs `tools` with at least one {\"type\": \"function\", \"function\": {\"name\", ..}}".into(),
                );
            }
            if let Some(name) = only.filter(|n| !names.contains(n)) {
                return bad(
                    "tool_choice",
                    format!("no tool named {name:?} in `tools` (they are {names:?})"),
                );
            }
        }
        let constraints: Vec<&str> = [
            (
                "response_format",
                p.response_format
                    .as_ref()
                    .is_some_and(|f| *f != ResponseFormat::Text {}),
            ),
            ("regex", p.regex.is_some()),
            ("grammar", p.grammar.is_some()),
            ("tool_choice", forced.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
        .collect();
        if let [first, second, ..] = constraints[..] {
            return bad(
                second,
                format!("only one constraint per request: {first} is given too"),
            );
        }
        if p.logprobs > MAX_LOGPROBS {
            return bad(
                "logprobs",
                format!("must be in 0..={MAX_LOGPROBS}, not {}", p.logprobs),
            );
        }
        Ok(())
    }
}

/// The largest `logprobs` a request may ask for.
pub const MAX_LOGPROBS: u8 = 20;

// The contract's defaults of `generate` are its fields' serde defaults (the sampler settings'
// in `sampling.rs`): their one home.
fn default_max_new_tokens() -> u32 {
    256
}

/// Params of `generate`. Absent fields take the contract's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateParams {
    /// Which resident model; default the active one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation (required; non-empty unless `prompt_ids` is given).
    pub messages: Vec<ChatMessage>,
    /// A raw completion: these token ids are the prompt as they are (no chat template, no
    /// system prompt, nothing added); `messages` must then be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prepended as a system message when non-empty; default `""`.
    #[serde(default)]
    pub system_prompt: String,
    /// One image (base64, data URL or local path) for the last user message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Most tokens to generate; default 256.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: u32,
    /// The sampler settings (`temperature`, `top_p`, ..), at the top level of the params.
    #[serde(flatten, deserialize_with = "crate::params::flattened")]
    pub sampling: Sampling,
    /// Stop sequences; never emitted, even in part.
    #[serde(default)]
    pub stop: Vec<String>,
    /// `false`: use the base weights although an adapter is loaded; default `null`.
    #[serde(default)]
    pub use_adapter: Option<bool>,
    /// When > 0, each delta carries `tokens` with this many top alternatives (0..=20).
    #[serde(default)]
    pub logprobs: u8,
    /// Passed to the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
    /// Tool definitions, passed to the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// Passed to the chat template; default true.
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// Passed to the chat template; default false.
    #[serde(default)]
    pub continue_final_message: bool,
    /// Passed to the chat template (e.g. `"low"`, `"medium"`, `"high"`); undefined when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Passed to the chat template (keep earlier turns' thinking); undefined when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_thinking: Option<bool>,
    /// OpenAI's output format: text (default), any JSON object, or JSON valid against a schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// The completion, as a whole, matches this regular expression (Rust `regex` syntax, no
    /// look-around or back-references).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// The completion is a sentence of this grammar: GBNF (llama.cpp's format, rule `root`)
    /// when it holds `::=`, else Lark (llguidance's dialect: rule `start`, `%json {schema}` for
    /// embedded JSON, regex terminals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// OpenAI's `tool_choice` (with `tools`): `"auto"` (default: the model may call tools; calls
    /// it writes are parsed), `"none"` (nothing parsed), `"required"` (the output is one or more
    /// calls, in the model family's syntax, arguments valid against each tool's schema), or
    /// `{"type": "function", "function": {"name"}}` (calls of that tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// OpenAI's: with forced calls, one or more (default true) or exactly one (false).
    #[serde(default = "default_true")]
    pub parallel_tool_calls: bool,
    /// Speculative decoding: draft tokens checked by one forward pass each round; the output is
    /// what one token per pass gives. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeParams>,
    /// What the prompt cache does with this request. Default: reuse and keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheParams>,
}

/// `cache`: the prompt cache's part in a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheParams {
    /// `false`: nothing of this request is kept (its KV cache, its image features): a
    /// conversation the host does not want held. It may still reuse what is kept, which it
    /// leaves as it was. Default `true`.
    #[serde(default = "yes")]
    pub persist: bool,
    /// The conversation this request continues or starts: its kept caches are that
    /// conversation's one entry, which `cache_list` shows and `cache_pin`, `cache_fork` and
    /// `cache_evict` act on. A prompt may still reuse another conversation's prefix (copied,
    /// so that one keeps its own). Absent: an unnamed entry, replaced by any that extends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
}

fn yes() -> bool {
    true
}

/// `speculative`: how drafts are found, and how many per pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeParams {
    /// `"prompt_lookup"`: the tokens that followed an earlier occurrence of the last few tokens,
    /// in the prompt or the output (good for editing, summarising, code changes);
    /// `"draft_model"`: the tokens the model's `draft_model` (see `load`) would write;
    /// `"mtp"`: the tokens the checkpoint's own multi-token-prediction head guesses;
    /// `"auto"`: the best of these the model has (`load`'s `info.speculative_auto`).
    pub method: SpeculativeMethod,
    /// Most draft tokens per pass (1..=64); default 10, for `mtp` the head's layers + 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_draft_tokens: Option<u32>,
}

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// N-gram matches in the prompt and the output so far (no draft model).
    PromptLookup,
    /// The `draft_model` loaded with the model, decoding greedily ahead of it.
    DraftModel,
    /// The model's own multi-token-prediction head (Qwen3.5's `mtp.*` layers), chained on its
    /// own hidden states; `load`'s `info.mtp_layers` says whether the model has one.
    Mtp,
    /// The model's own multi-token-prediction head, else its `draft_model`, else prompt lookup;
    /// `load`'s `info.speculative_auto` names the choice and why.
    Auto,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `"none"`, `"auto"` or `"required"`.
    Mode(ToolChoiceMode),
    /// One named function.
    Function(NamedFunction),
}

/// The string forms of `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    /// Calls are not parsed.
    None,
    /// The model may call tools.
    Auto,
    /// The model must call one or more tools.
    Required,
}

/// `{"type": "function", "function": {"name": ..}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    /// The tool to call.
    pub function: FunctionName,
}

/// The only kind of tool: `"function"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    /// A function tool.
    Function,
}

/// A function's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionName {
    /// As in `tools[].function.name`.
    pub name: String,
}

/// `response_format`, as OpenAI's chat completions take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    // Struct variants, not unit ones: serde lets a unit variant of an internally tagged enum
    // ignore unknown members even with `deny_unknown_fields`.
    /// Free text: no constraint.
    Text {},
    /// Any JSON object.
    JsonObject {},
    /// JSON valid against `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// The `json_schema` member of a `json_schema` response format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (OpenAI requires one; the worker only echoes it in errors).
    pub name: String,
    /// What the schema is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 as llguidance supports it).
    pub schema: Value,
    /// Accepted for OpenAI compatibility: the schema is always enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl GenerateParams {
    /// Params for `messages` with every other field at its default.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        GenerateParams {
            messages,
            ..with_defaults(json!({ "messages": [] }))
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_new_tokens` (or the context) ran out.
    Length,
    /// A stop sequence matched.
    StopSequence,
    /// Cancelled; the text so far is returned.
    Cancelled,
    /// The model called tools (`tool_calls` holds them); ended as `stop` would.
    ToolCalls,
}

/// Token counts of a generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Tokens in the templated prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// Prompt tokens reused from a prompt cache.
    pub cached_tokens: u64,
    /// Images whose vision-encoder output was reused from an earlier request (the tower did not
    /// run for them); 0 for text.
    #[serde(default)]
    pub cached_images: u64,
    /// Speculative decoding: tokens drafted (0 without `speculative`).
    #[serde(default)]
    pub drafted_tokens: u64,
    /// Of those, how many the model confirmed (each saved a forward pass).
    #[serde(default)]
    pub accepted_tokens: u64,
    /// Speculative decoding: prompt positions the drafter (a draft model, the model's own
    /// multi-token-prediction head, an EAGLE-3 or block drafter) did not run again because the
    /// prompt cache kept its caches with the model's (0 without `speculative`).
    #[serde(default)]
    pub draft_cached_tokens: u64,
}

/// Timings, with llama-server's field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Timings {
    /// Prompt tokens processed.
    pub prompt_n: u64,
    /// Prefill time (ms).
    pub prompt_ms: f64,
    /// Prefill speed (tokens/s).
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: u64,
    /// Decode time (ms).
    pub predicted_ms: f64,
    /// Decode speed (tokens/s).
    pub predicted_per_second: f64,
    /// Time to first token (ms).
    pub ttft_ms: f64,
}

/// Result of `generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GenerateResult {
    /// The whole completion.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Timings.
    pub timings: Timings,
    /// With `tools`: the calls the model wrote, parsed (the raw text stays in `text`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallOut {
    /// Unique within the worker's lifetime (`call_<n>`).
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function a tool call calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments as JSON text (OpenAI's `arguments`).
    pub arguments: String,
}

notification!(
    /// `generate/delta`: new text of a running `generate`.
    GenerateDeltaNotification,
    "generate/delta",
    GenerateDelta
);

/// Params of `generate/delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GenerateDelta {
    /// The id of the `generate` request.
    pub request_id: RequestId,
    /// Counts deltas of this request from 0.
    pub index: u64,
    /// Only the text new since the last delta: valid UTF-8, never part of a stop sequence.
    pub text: String,
    /// With `logprobs > 0`: the tokens of this delta and their log-probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<TokenLogprob>>,
    /// For a model with reasoning markup (`<think>` ... `</think>` in its vocabulary): whether
    /// this text is its reasoning (the tags included) or its answer. Absent for other models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
}

/// The part of a reasoning model's output a delta belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// The model's reasoning, its markup included.
    Reasoning,
    /// The answer.
    Content,
}

/// A generated token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenLogprob {
    /// Token id.
    pub id: u32,
    /// Its text.
    pub text: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The most likely alternatives, best first.
    pub top: Vec<TopLogprob>,
}

/// An alternative token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TopLogprob {
    /// Token id.
    pub id: u32,
    /// Natural-log probability.
    pub logprob: f32,
}
