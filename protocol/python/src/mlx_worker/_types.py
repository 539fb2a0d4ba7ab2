"""The protocol's types, generated from protocol/schema.json by _codegen.py: do not edit.

Objects are ``TypedDict``s (what the client sends and returns are plain JSON dicts), enums are
``Literal`` aliases. Regenerate with ``python protocol/python/src/mlx_worker/_codegen.py``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, Union

PROTOCOL_VERSION = '1'


class InitializeParams(TypedDict, total=False):
    """Params of `initialize`; all optional."""
    #: Who is calling.
    client: ClientInfo | None
    #: The protocol version the host speaks (`"1"`).
    protocol_version: str | None


class _ClientInfoRequired(TypedDict):
    #: Its name, e.g. `"unsloth-studio"`.
    name: str


class ClientInfo(_ClientInfoRequired, total=False):
    """The host that calls, as LSP's `clientInfo`: a name, a version if it has one."""
    #: Its version.
    version: str | None


class _InitializeResultRequired(TypedDict):
    #: The protocol version the worker speaks ([`PROTOCOL_VERSION`]).
    protocol_version: str
    #: The worker's name and version.
    worker: ProgramInfo
    #: MLX's version, backend and device.
    mlx: MlxInfo
    #: What the worker supports.
    capabilities: Capabilities


class InitializeResult(_InitializeResultRequired, total=False):
    """Result of `initialize`."""
    #: The group of ranks the worker runs as; absent for one process.
    group: GroupInfo | None


class ProgramInfo(TypedDict):
    """A program's name and version."""
    #: Its name, e.g. `"unsloth-studio"`.
    name: str
    #: Its version.
    version: str


class MlxInfo(TypedDict):
    """MLX's version, backend and device."""
    #: MLX's version.
    version: str
    #: The backend.
    backend: Backend
    #: The device.
    device: DeviceInfo


#: The MLX backend in use.
Backend = Literal['metal', 'cuda', 'cpu']


class _DeviceInfoRequired(TypedDict):
    #: Its name, e.g. `"Apple M2 Max"`.
    name: str
    #: Its memory (bytes).
    memory_bytes: int


class DeviceInfo(_DeviceInfoRequired, total=False):
    """The device MLX computes on."""
    #: On Metal, the recommended working-set size (bytes).
    recommended_working_set_bytes: int | None


class Capabilities(TypedDict):
    """What the worker supports."""
    #: `model_type`s the worker can load, e.g. `["llama", "qwen2"]`.
    architectures: list[str]
    #: Image inputs are supported.
    vision: bool
    #: LoRA adapters are supported.
    lora: bool
    #: GGUF files are supported.
    gguf: bool
    #: The queue's capacity (`--max-queue`).
    max_queue: int
    #: Most generations that run together, sharing each decode step (`--max-batch`; 1: one at
    #: a time).
    max_batch: int
    #: How generations that run together attend (`--batch-attention`, `auto` resolved).
    batch_attention: BatchAttention


#: How the rows of a batch attend.
BatchAttention = Literal['rows', 'padded']


class GroupInfo(TypedDict):
    """The worker's group of ranks (started by `mlx.launch` or `cargo xtask launch`)."""
    #: MLX's distributed backend: `ring`, `jaccl`, `nccl` or `mpi`.
    backend: str
    #: Number of ranks.
    size: int
    #: This process's rank (the one that speaks JSON-RPC is 0).
    rank: int


class _LoadParamsRequired(TypedDict):
    #: A Hugging Face repo id (`org/name`), a local model directory, or a `.gguf` file.
    model: str


class LoadParams(_LoadParamsRequired, total=False):
    """Params of `load`."""
    #: Hub revision; default `"main"`.
    #: default: "main"
    revision: str
    #: A LoRA adapter directory or repo id applied on top of `model`.
    adapter: str | None
    #: Context limit; 0 (the default) means the model's own `max_position_embeddings`.
    #: default: 0
    max_seq_length: int
    #: Quantize on load to affine 4-bit, group 64, unless already quantized.
    #: default: false
    load_in_4bit: bool
    #: Compute dtype for unquantized weights; default from the model's config.
    dtype: Dtype | None
    #: Hub token: used for the hub only, never logged or echoed (`Debug` shows `<redacted>`).
    hf_token: Secret | None
    #: Accepted for compatibility; no remote code ever runs (a warning is logged when true).
    #: default: false
    trust_remote_code: bool
    #: Hint only; the worker detects it.
    is_vision: bool | None
    #: Hint only; the worker detects it.
    is_lora: bool | None
    #: Hint only; the worker detects it.
    is_gguf: bool | None
    #: A Jinja chat template used instead of the model's.
    chat_template_override: str | None
    #: Quantize the KV cache to this many bits (4 or 8).
    kv_bits: int | None
    #: A smaller model with the same tokenizer (directory, `.gguf` or repo id, same `hf_token`),
    #: loaded beside this one for `speculative: {"method": "draft_model"}` on `generate`.
    draft_model: str | None
    #: Split the model over the worker's group of ranks: `"tensor"` or `"pipeline"`. Only when
    #: the worker runs as a group (`initialize`'s `group`).
    parallel: ParallelMode | None
    #: Reload even if this model is already resident.
    #: default: false
    force: bool


#: A compute dtype.
Dtype = Literal['bfloat16', 'float16', 'float32']


#: A credential such as `hf_token`.
#:
#: `Debug` and `Display` print `<redacted>`; the value is reached only through
#: [`Secret::expose`]. It serialises as the plain string so that a host can send it; the worker
#: never puts one into a response, a notification, a log line or the environment. Its bytes are
#: overwritten with zeros when it is dropped.
Secret = str


#: How a model is split over the ranks of a group (`load`'s `parallel`; mlx-lm's names).
ParallelMode = Literal['tensor', 'pipeline']


class LoadResult(TypedDict):
    """Result of `load`."""
    #: The id to name this model by in later requests.
    model_id: str
    #: What was loaded.
    info: ModelInfo
    #: Wall time of the load (ms).
    load_ms: int
    #: Memory after the load.
    memory: MemoryInfo


class _ModelInfoRequired(TypedDict):
    #: The model's name for people: the last component of `model` (a `.gguf` without its
    #: extension), e.g. `"SmolLM2-135M-Instruct"`.
    display_name: str
    #: The architecture class of `config.json`, e.g. `"LlamaForCausalLM"`.
    architecture: str
    #: `model_type` of `config.json`, e.g. `"llama"`.
    model_type: str
    #: The model takes images.
    is_vision: bool
    #: A LoRA adapter is applied.
    is_lora: bool
    #: Loaded from a GGUF file.
    is_gguf: bool
    #: The compute dtype.
    dtype: Dtype
    #: The context limit in force (tokens).
    context_length: int
    #: The model's own context (its config's `max_position_embeddings`; 4096 when it names
    #: none), whatever `max_seq_length` asked for.
    native_context_length: int
    #: Parameter count.
    num_parameters: int
    #: Vocabulary size.
    vocab_size: int
    #: Tokens that end a generation.
    eos_token_ids: list[int]
    #: The chat template in use.
    chat_template: ChatTemplateInfo
    #: The tokenizer's special tokens.
    special_tokens: SpecialTokens
    #: The KV cache's quantization (`kv_bits`).
    kv_quantization: KvQuantization


class ModelInfo(_ModelInfoRequired, total=False):
    """What the worker knows about a loaded model."""
    #: The weights' quantization; `null` when unquantized.
    quantization: Quantization | None
    #: How the model is split over the worker's group of ranks; absent when it is not.
    parallel: ParallelInfo | None
    #: Layers of the checkpoint's own multi-token-prediction head, loaded as a drafter for
    #: `speculative: {"method": "mtp"}`; 0: it has none.
    #: default: 0
    mtp_layers: int
    #: What `draft_model` turned out to be, when one was loaded: `"model"` (a smaller model of
    #: the same vocabulary), or a drafter reading this model's hidden states: `"dflash"`,
    #: `"dflash2"`, `"dspark"` or `"eagle3"`; each drafts for `speculative: {"method":
    #: "draft_model"}`.
    draft_kind: DraftKind | None
    #: What `speculative: {"method": "auto"}` drafts with on this model, and why.
    #: default: {"method": null, "reason": ""}
    speculative_auto: AutoDrafter
    #: What the model holds and needs in memory, and whether the context was fitted to it.
    #: default: {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "available_bytes": null, "fitted_from": null, "reason": null}
    memory: MemoryPlan


class Quantization(TypedDict):
    """How a model's weights are quantized."""
    #: Bits per weight, e.g. 4.
    bits: int
    #: Weights sharing one scale and bias, e.g. 64.
    group_size: int


class _ChatTemplateInfoRequired(TypedDict):
    #: True when a template is in use.
    present: bool
    #: Its origin.
    source: ChatTemplateSource


class ChatTemplateInfo(_ChatTemplateInfoRequired, total=False):
    """Whether a model has a chat template, and from where."""
    #: The template's raw Jinja text (the one used without tools when a model has several);
    #: `null` without a template. Hosts classify a model's capabilities from it.
    text: str | None


#: Where a model's chat template came from.
ChatTemplateSource = Literal['tokenizer_config', 'chat_template.jinja', 'chat_template.json', 'gguf', 'override', 'none']


class SpecialTokens(TypedDict, total=False):
    """The tokenizer's special tokens, as text (`null` when the model has none)."""
    #: Beginning of sequence.
    bos: str | None
    #: End of sequence.
    eos: str | None
    #: Padding.
    pad: str | None


class KvQuantization(TypedDict, total=False):
    """What became of `load`'s `kv_bits`: a model whose attention heads cannot be quantized loads
    with a plain KV cache, and says why.
    """
    #: `kv_bits` as asked for; `null` when not asked.
    requested: int | None
    #: The bits the KV cache is quantized to; `null`: a plain cache.
    applied: int | None
    #: Why `applied` differs from `requested`; `null` when they agree.
    reason: str | None


class ParallelInfo(TypedDict):
    """A split model: the mode and what each rank holds."""
    #: How it is split.
    mode: ParallelMode
    #: Each rank's share, by rank.
    ranks: list[RankShare]


class RankShare(TypedDict):
    """What one rank holds of a split model."""
    #: The rank.
    rank: int
    #: The layers it runs: `[start, end)`.
    layers: list[int]
    #: Bytes of the weights it holds (its linear layers and embedding).
    weight_bytes: int


#: What a load's `draft_model` is.
DraftKind = Literal['model', 'dflash', 'dflash2', 'dspark', 'eagle3']


class _AutoDrafterRequired(TypedDict):
    #: Why, in words a host can show.
    reason: str


class AutoDrafter(_AutoDrafterRequired, total=False):
    """`load`'s answer to which drafter `speculative: {"method": "auto"}` uses."""
    #: The drafter (never `"auto"`); `null` when this model runs one token per pass.
    method: SpeculativeMethod | None


#: Where draft tokens come from.
SpeculativeMethod = Literal['prompt_lookup', 'draft_model', 'mtp', 'auto']


class _MemoryPlanRequired(TypedDict):
    #: Bytes of the weights as held (the vision tower's and the drafter's with them).
    weights_bytes: int
    #: Bytes of the KV cache of a generation filling `context_length`, at the KV width.
    kv_bytes: int
    #: Bytes of the activations of a prefill chunk at the end of the context.
    compute_bytes: int


class MemoryPlan(_MemoryPlanRequired, total=False):
    """`load`'s pricing of the model's memory: weights as held, and what a generation filling the
    context needs beside them, against what MLX's memory limit left when it loaded.
    """
    #: Bytes the limit left beside the weights when the model loaded (MLX's limit, less what
    #: other residents held); `null`: no limit known. Kept conversations' caches
    #: (`--prompt-cache-bytes`) do not count: a generation that needs their memory has them
    #: dropped.
    available_bytes: int | None
    #: The context asked for (`max_seq_length`, else the model's own) when `context_length`
    #: was lowered to what fits; `null`: not lowered.
    fitted_from: int | None
    #: Why the context was lowered, or why a generation filling it may not fit; `null` when it
    #: fits.
    reason: str | None


class MemoryInfo(TypedDict):
    """MLX memory figures, in bytes."""
    #: Memory held by live arrays now.
    active_bytes: int
    #: The most held at once since start (or the last reset of the peak).
    peak_bytes: int
    #: MLX's memory limit.
    limit_bytes: int


class _GenerateParamsRequired(TypedDict):
    #: The conversation (required; non-empty unless `prompt_ids` is given).
    messages: list[ChatMessage]


class GenerateParams(_GenerateParamsRequired, total=False):
    """Params of `generate`. Absent fields take the contract's defaults."""
    #: Which resident model; default the active one.
    model: str | None
    #: A raw completion: these token ids are the prompt as they are (no chat template, no
    #: system prompt, nothing added); `messages` must then be empty.
    prompt_ids: list[int] | None
    #: Prepended as a system message when non-empty; default `""`.
    #: default: ""
    system_prompt: str
    #: One image (base64, data URL or local path) for the last user message.
    image: str | None
    #: Most tokens to generate; default 256.
    #: default: 256
    max_new_tokens: int
    #: Sampling temperature; 0 means greedy; default 0.7.
    #: default: 0.7
    temperature: float
    #: Nucleus sampling mass; 1.0 disables; default 0.9.
    #: default: 0.9
    top_p: float
    #: Keep the k most likely tokens; 0 or -1 disables; default 40.
    #: default: 40
    top_k: int
    #: Drop tokens below `min_p` times the top token's probability; default 0.
    #: default: 0.0
    min_p: float
    #: Penalty over the last `repetition_context_size` tokens; 1.0 (default) disables.
    #: default: 1.0
    repetition_penalty: float
    #: Window of the repetition penalty (tokens); default 20.
    #: default: 20
    repetition_context_size: int
    #: OpenAI presence penalty; default 0.
    #: default: 0.0
    presence_penalty: float
    #: OpenAI frequency penalty; default 0.
    #: default: 0.0
    frequency_penalty: float
    #: Same seed, params and model: same tokens.
    seed: int | None
    #: OpenAI's `logit_bias`: token id (as a string) -> bias added to its logit (-100..=100).
    logit_bias: dict[str, float]
    #: Stop sequences; never emitted, even in part.
    #: default: []
    stop: list[str]
    #: `false`: use the base weights although an adapter is loaded; default `null`.
    #: default: null
    use_adapter: bool | None
    #: When > 0, each delta carries `tokens` with this many top alternatives (0..=20).
    #: default: 0
    logprobs: int
    #: Passed to the chat template.
    enable_thinking: bool | None
    #: Tool definitions, passed to the chat template.
    tools: Any
    #: Passed to the chat template; default true.
    #: default: true
    add_generation_prompt: bool
    #: Passed to the chat template; default false.
    #: default: false
    continue_final_message: bool
    #: Passed to the chat template (e.g. `"low"`, `"medium"`, `"high"`); undefined when absent.
    reasoning_effort: str | None
    #: Passed to the chat template (keep earlier turns' thinking); undefined when absent.
    preserve_thinking: bool | None
    #: OpenAI's output format: text (default), any JSON object, or JSON valid against a schema.
    response_format: ResponseFormat | None
    #: The completion, as a whole, matches this regular expression (Rust `regex` syntax, no
    #: look-around or back-references).
    regex: str | None
    #: The completion is a sentence of this grammar: GBNF (llama.cpp's format, rule `root`)
    #: when it holds `::=`, else Lark (llguidance's dialect: rule `start`, `%json {schema}` for
    #: embedded JSON, regex terminals).
    grammar: str | None
    #: OpenAI's `tool_choice` (with `tools`): `"auto"` (default: the model may call tools; calls
    #: it writes are parsed), `"none"` (nothing parsed), `"required"` (the output is one or more
    #: calls, in the model family's syntax, arguments valid against each tool's schema), or
    #: `{"type": "function", "function": {"name"}}` (calls of that tool).
    tool_choice: ToolChoice | None
    #: OpenAI's: with forced calls, one or more (default true) or exactly one (false).
    #: default: true
    parallel_tool_calls: bool
    #: Speculative decoding: draft tokens checked by one forward pass each round; the output is
    #: what one token per pass gives. Default: none.
    speculative: SpeculativeParams | None
    #: What the prompt cache does with this request. Default: reuse and keep.
    cache: CacheParams | None


class ChatMessage(TypedDict):
    """One chat message: `{role, content}`.

    Members other than `role` and `content` (e.g. `tool_calls`, `name`) are kept in `extra` and
    passed to the chat template as they are.
    """
    #: `"system"`, `"user"`, `"assistant"`, `"tool"`, or what the template knows.
    role: str
    #: A string, or a list of text and image parts.
    content: MessageContent


#: The `content` of a [`ChatMessage`].
MessageContent = Union[str, list['ContentPart']]


class ContentPartText(TypedDict):
    """`{type: "text", text}`."""
    type: Literal['text']
    #: The text.
    text: str


class ContentPartImage(TypedDict):
    """`{type: "image", image}`: base64, a data URL or a local path."""
    type: Literal['image']
    #: The image.
    image: str


class ContentPartImageUrl(TypedDict):
    """OpenAI's `{type: "image_url", image_url: {url}}`: a data URL or a local path."""
    type: Literal['image_url']
    #: Where the image is.
    image_url: ImageUrl


#: One part of a multi-part [`MessageContent`].
ContentPart = Union[ContentPartText, ContentPartImage, ContentPartImageUrl]


class ImageUrl(TypedDict):
    """The `image_url` member of an OpenAI image part."""
    #: A data URL (`data:image/png;base64,...`), base64 or a local path; `http(s)` URLs are
    #: refused (the worker does not fetch).
    url: str


class ResponseFormatText(TypedDict):
    """Free text: no constraint."""
    type: Literal['text']


class ResponseFormatJsonObject(TypedDict):
    """Any JSON object."""
    type: Literal['json_object']


class ResponseFormatJsonSchema(TypedDict):
    """JSON valid against `json_schema.schema`."""
    type: Literal['json_schema']
    #: The schema and its name.
    json_schema: JsonSchemaFormat


#: `response_format`, as OpenAI's chat completions take it.
ResponseFormat = Union[ResponseFormatText, ResponseFormatJsonObject, ResponseFormatJsonSchema]


class _JsonSchemaFormatRequired(TypedDict):
    #: The schema's name (OpenAI requires one; the worker only echoes it in errors).
    name: str
    #: A JSON Schema (draft 2020-12 as llguidance supports it).
    schema: Any


class JsonSchemaFormat(_JsonSchemaFormatRequired, total=False):
    """The `json_schema` member of a `json_schema` response format."""
    #: What the schema is for.
    description: str | None
    #: Accepted for OpenAI compatibility: the schema is always enforced.
    strict: bool | None


#: `tool_choice`.
ToolChoice = Union['ToolChoiceMode', 'NamedFunction']


#: The string forms of `tool_choice`.
ToolChoiceMode = Literal['none', 'auto', 'required']


class NamedFunction(TypedDict):
    """`{"type": "function", "function": {"name": ..}}`."""
    #: Always `"function"`.
    type: FunctionKind
    #: The tool to call.
    function: FunctionName


#: The only kind of tool: `"function"`.
FunctionKind = Literal['function']


class FunctionName(TypedDict):
    """A function's name."""
    #: As in `tools[].function.name`.
    name: str


class _SpeculativeParamsRequired(TypedDict):
    #: `"prompt_lookup"`: the tokens that followed an earlier occurrence of the last few tokens,
    #: in the prompt or the output (good for editing, summarising, code changes);
    #: `"draft_model"`: the tokens the model's `draft_model` (see `load`) would write;
    #: `"mtp"`: the tokens the checkpoint's own multi-token-prediction head guesses;
    #: `"auto"`: the best of these the model has (`load`'s `info.speculative_auto`).
    method: SpeculativeMethod


class SpeculativeParams(_SpeculativeParamsRequired, total=False):
    """`speculative`: how drafts are found, and how many per pass."""
    #: Most draft tokens per pass (1..=64); default 10, for `mtp` the head's layers + 1.
    num_draft_tokens: int | None


class CacheParams(TypedDict, total=False):
    """`cache`: the prompt cache's part in a request."""
    #: `false`: nothing of this request is kept (its KV cache, its image features): a
    #: conversation the host does not want held. It may still reuse what is kept, which it
    #: leaves as it was. Default `true`.
    #: default: true
    persist: bool
    #: The conversation this request continues or starts: its kept caches are that
    #: conversation's one entry, which `cache_list` shows and `cache_pin`, `cache_fork` and
    #: `cache_evict` act on. A prompt may still reuse another conversation's prefix (copied,
    #: so that one keeps its own). Absent: an unnamed entry, replaced by any that extends it.
    conversation_id: str | None


class _GenerateResultRequired(TypedDict):
    #: The whole completion.
    text: str
    #: Why it ended.
    finish_reason: FinishReason
    #: Token counts.
    usage: Usage
    #: Timings.
    timings: Timings


class GenerateResult(_GenerateResultRequired, total=False):
    """Result of `generate`."""
    #: With `tools`: the calls the model wrote, parsed (the raw text stays in `text`).
    tool_calls: list[ToolCallOut]


#: Why a generation ended.
FinishReason = Literal['stop', 'length', 'stop_sequence', 'cancelled', 'tool_calls']


class _UsageRequired(TypedDict):
    #: Tokens in the templated prompt.
    prompt_tokens: int
    #: Tokens generated.
    completion_tokens: int
    #: Their sum.
    total_tokens: int
    #: Prompt tokens reused from a prompt cache.
    cached_tokens: int


class Usage(_UsageRequired, total=False):
    """Token counts of a generation."""
    #: Images whose vision-encoder output was reused from an earlier request (the tower did not
    #: run for them); 0 for text.
    #: default: 0
    cached_images: int
    #: Speculative decoding: tokens drafted (0 without `speculative`).
    #: default: 0
    drafted_tokens: int
    #: Of those, how many the model confirmed (each saved a forward pass).
    #: default: 0
    accepted_tokens: int
    #: Speculative decoding: prompt positions the drafter (a draft model, the model's own
    #: multi-token-prediction head, an EAGLE-3 or block drafter) did not run again because the
    #: prompt cache kept its caches with the model's (0 without `speculative`).
    #: default: 0
    draft_cached_tokens: int


class Timings(TypedDict):
    """Timings, with llama-server's field names."""
    #: Prompt tokens processed.
    prompt_n: int
    #: Prefill time (ms).
    prompt_ms: float
    #: Prefill speed (tokens/s).
    prompt_per_second: float
    #: Tokens generated.
    predicted_n: int
    #: Decode time (ms).
    predicted_ms: float
    #: Decode speed (tokens/s).
    predicted_per_second: float
    #: Time to first token (ms).
    ttft_ms: float


class ToolCallOut(TypedDict):
    """A tool call, in OpenAI's shape."""
    #: Unique within the worker's lifetime (`call_<n>`).
    id: str
    #: Always `"function"`.
    type: FunctionKind
    #: The function and its arguments.
    function: FunctionCall


class FunctionCall(TypedDict):
    """The function a tool call calls."""
    #: Its name.
    name: str
    #: Its arguments as JSON text (OpenAI's `arguments`).
    arguments: str


class CancelParams(TypedDict):
    """Params of `cancel`."""
    #: The id of the queued or running request to cancel.
    request_id: RequestId


#: The id of a request: a JSON number (integer) or a string, echoed verbatim in its response.
#:
#: Two ids are equal only when they have the same kind and value: `1` and `"1"` differ.
RequestId = Union[int, str]


class CancelResult(TypedDict):
    """Result of `cancel`."""
    #: True when the request was queued or running and is now cancelled.
    cancelled: bool


class UnloadParams(TypedDict, total=False):
    """Params of `unload`."""
    #: The model to unload; default all.
    model: str | None


class UnloadResult(TypedDict):
    """Result of `unload`."""
    #: Ids of the models unloaded.
    unloaded: list[str]
    #: Memory afterwards.
    memory: MemoryInfo


class ResetParams(TypedDict, total=False):
    """Params of `reset`."""
    #: Also clear every resident's prompt cache; default true. Studio resets after every
    #: stopped reply and keeps its conversations' caches (`false`).
    #: default: true
    prompt_cache: bool


class ResetResult(TypedDict):
    """Result of `reset`."""
    #: Memory afterwards.
    memory: MemoryInfo


class StatusParams(TypedDict):
    """Params of `status` (none)."""


class _StatusResultRequired(TypedDict):
    #: What the worker is doing.
    state: WorkerState
    #: Every resident model.
    models: list[ResidentModel]
    #: The queue.
    queue: QueueInfo
    #: MLX memory.
    memory: MemoryInfo
    #: Time since start (ms).
    uptime_ms: int
    #: Requests answered so far.
    requests_served: int


class StatusResult(_StatusResultRequired, total=False):
    """Result of `status`."""
    #: The active model's id; `null` when none is loaded.
    active_model: str | None
    #: The prompt cache's tiers: what they hold and their hit rates.
    #: default: {"lookups": 0, "memory": {"entries": 0, "bytes": 0, "hits": 0, "hit_tokens": 0, "hit_rate": 0.0}}
    prompt_cache: PromptCacheInfo
    #: The group of ranks the worker runs as; absent for one process.
    group: GroupInfo | None


#: What the worker is doing.
WorkerState = Literal['idle', 'loading', 'generating']


class _ResidentModelRequired(TypedDict):
    #: The model's id (as returned by `load`).
    model_id: str
    #: The model's name for people: the last component of `model` (a `.gguf` without its
    #: extension), e.g. `"SmolLM2-135M-Instruct"`.
    display_name: str
    #: The architecture class of `config.json`, e.g. `"LlamaForCausalLM"`.
    architecture: str
    #: `model_type` of `config.json`, e.g. `"llama"`.
    model_type: str
    #: The model takes images.
    is_vision: bool
    #: A LoRA adapter is applied.
    is_lora: bool
    #: Loaded from a GGUF file.
    is_gguf: bool
    #: The compute dtype.
    dtype: Dtype
    #: The context limit in force (tokens).
    context_length: int
    #: The model's own context (its config's `max_position_embeddings`; 4096 when it names
    #: none), whatever `max_seq_length` asked for.
    native_context_length: int
    #: Parameter count.
    num_parameters: int
    #: Vocabulary size.
    vocab_size: int
    #: Tokens that end a generation.
    eos_token_ids: list[int]
    #: The chat template in use.
    chat_template: ChatTemplateInfo
    #: The tokenizer's special tokens.
    special_tokens: SpecialTokens
    #: The KV cache's quantization (`kv_bits`).
    kv_quantization: KvQuantization


class ResidentModel(_ResidentModelRequired, total=False):
    """A resident model: its id and its [`ModelInfo`] members side by side."""
    #: The weights' quantization; `null` when unquantized.
    quantization: Quantization | None
    #: How the model is split over the worker's group of ranks; absent when it is not.
    parallel: ParallelInfo | None
    #: Layers of the checkpoint's own multi-token-prediction head, loaded as a drafter for
    #: `speculative: {"method": "mtp"}`; 0: it has none.
    #: default: 0
    mtp_layers: int
    #: What `draft_model` turned out to be, when one was loaded: `"model"` (a smaller model of
    #: the same vocabulary), or a drafter reading this model's hidden states: `"dflash"`,
    #: `"dflash2"`, `"dspark"` or `"eagle3"`; each drafts for `speculative: {"method":
    #: "draft_model"}`.
    draft_kind: DraftKind | None
    #: What `speculative: {"method": "auto"}` drafts with on this model, and why.
    #: default: {"method": null, "reason": ""}
    speculative_auto: AutoDrafter
    #: What the model holds and needs in memory, and whether the context was fitted to it.
    #: default: {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "available_bytes": null, "fitted_from": null, "reason": null}
    memory: MemoryPlan


class QueueInfo(TypedDict):
    """The queue of `load`/`generate`/`unload`/`reset`."""
    #: Requests running (0 or 1).
    running: int
    #: Requests waiting.
    waiting: int


class _PromptCacheInfoRequired(TypedDict):
    #: Prompts looked up (generations that may reuse kept caches).
    lookups: int
    #: The memory tier (every resident's prompt cache).
    memory: CacheTierInfo


class PromptCacheInfo(_PromptCacheInfoRequired, total=False):
    """`status`'s `prompt_cache`: what each tier holds and has served since the worker started."""
    #: Absent when the disk tier is off.
    disk: DiskTierInfo | None


class CacheTierInfo(TypedDict):
    """A tier: what it holds now and the lookups it served."""
    #: Conversations held (on disk: files, every model's).
    entries: int
    #: Bytes they take.
    bytes: int
    #: Lookups that reused caches from this tier.
    hits: int
    #: Prompt tokens those reused.
    hit_tokens: int
    #: `hits / lookups` (0 before any lookup).
    hit_rate: float


class DiskTierInfo(TypedDict):
    """The disk tier."""
    #: Conversations held (on disk: files, every model's).
    entries: int
    #: Bytes they take.
    bytes: int
    #: Lookups that reused caches from this tier.
    hits: int
    #: Prompt tokens those reused.
    hit_tokens: int
    #: `hits / lookups` (0 before any lookup).
    hit_rate: float
    #: `--disk-cache-bytes`.
    budget_bytes: int
    #: Files written by this worker.
    writes: int
    #: Their bytes.
    written_bytes: int
    #: Entries dropped instead of written: past the hour's write budget
    #: (`--disk-cache-write-bytes-per-hour`) or larger than the tier.
    skipped_writes: int
    #: Damaged or foreign files deleted.
    rejected: int


class TokenizeParams(TypedDict, total=False):
    """Params of `tokenize`: exactly one of `text` and `messages`."""
    #: Which resident model; default the active one.
    model: str | None
    #: Text to tokenize as it is.
    text: str | None
    #: A conversation; the chat template is applied first.
    messages: list[ChatMessage] | None
    #: With `messages`: append the assistant prompt; default true.
    #: default: true
    add_generation_prompt: bool
    #: With `messages`: the template's inputs as `generate` takes them, so a count is the
    #: prompt `generate` would run. Prepended as a system message when non-empty.
    system_prompt: str
    #: Passed to the chat template.
    tools: Any
    #: Passed to the chat template.
    enable_thinking: bool | None
    #: Passed to the chat template; undefined when absent.
    reasoning_effort: str | None
    #: Passed to the chat template; undefined when absent.
    preserve_thinking: bool | None


class _TokenizeResultRequired(TypedDict):
    #: Token ids.
    tokens: list[int]
    #: Their number.
    count: int


class TokenizeResult(_TokenizeResultRequired, total=False):
    """Result of `tokenize`."""
    #: With `messages`: the templated prompt.
    prompt: str | None


class CacheListParams(TypedDict, total=False):
    """Params of `cache_list`."""
    #: A resident model's id; default the active model.
    model: str | None


class CacheListResult(TypedDict):
    """Result of `cache_list`."""
    #: The model listed.
    model_id: str
    #: In memory (least recently used first), then on disk only.
    conversations: list[KeptConversation]


class _KeptConversationRequired(TypedDict):
    #: Tokens its caches hold (the prompt and reply so far).
    tokens: int
    #: Bytes they take (in memory, or of the file).
    bytes: int
    #: Where its caches are.
    tier: CacheTier
    #: Kept in memory past the budget (`cache_pin`).
    pinned: bool


class KeptConversation(_KeptConversationRequired, total=False):
    """One kept conversation."""
    #: The id `generate` named it by; `null` for a request that named none.
    conversation_id: str | None


#: Where a kept conversation's caches are.
CacheTier = Literal['memory', 'disk']


class _CachePinParamsRequired(TypedDict):
    #: The conversation (read back into memory if it is only on disk).
    conversation_id: str


class CachePinParams(_CachePinParamsRequired, total=False):
    """Params of `cache_pin`."""
    #: A resident model's id; default the active model.
    model: str | None
    #: `false` unpins; default true.
    #: default: true
    pinned: bool


class CachePinResult(TypedDict):
    """Result of `cache_pin`."""
    #: Whether it is pinned now.
    pinned: bool


class _CacheForkParamsRequired(TypedDict):
    #: The conversation to start from.
    conversation_id: str
    #: The new conversation's id (not yet kept).
    new_conversation_id: str


class CacheForkParams(_CacheForkParamsRequired, total=False):
    """Params of `cache_fork`."""
    #: A resident model's id; default the active model.
    model: str | None
    #: How many of its tokens the new one starts with; default all.
    tokens: int | None


class CacheForkResult(TypedDict):
    """Result of `cache_fork`."""
    #: Tokens the new conversation holds.
    tokens: int


class CacheEvictParams(TypedDict, total=False):
    """Params of `cache_evict`."""
    #: A resident model's id; default the active model.
    model: str | None
    #: The conversation to forget; absent: every conversation of the model.
    conversation_id: str | None


class CacheEvictResult(TypedDict):
    """Result of `cache_evict`."""
    #: Entries and files removed.
    evicted: int


class ShutdownParams(TypedDict):
    """Params of `shutdown` (none)."""


class ShutdownResult(TypedDict):
    """Result of `shutdown`: `{}`."""


class _LoadProgressRequired(TypedDict):
    #: The id of the `load` request.
    request_id: RequestId
    #: The stage.
    stage: LoadStage
    #: Units done in this stage (bytes or files).
    done: int
    #: Units in this stage (0 when unknown).
    total: int


class LoadProgress(_LoadProgressRequired, total=False):
    """Params of `load/progress`."""
    #: A line for people.
    #: default: ""
    message: str


#: A stage of loading.
LoadStage = Literal['resolve', 'download', 'weights', 'tokenizer', 'ready']


class _GenerateDeltaRequired(TypedDict):
    #: The id of the `generate` request.
    request_id: RequestId
    #: Counts deltas of this request from 0.
    index: int
    #: Only the text new since the last delta: valid UTF-8, never part of a stop sequence.
    text: str


class GenerateDelta(_GenerateDeltaRequired, total=False):
    """Params of `generate/delta`."""
    #: With `logprobs > 0`: the tokens of this delta and their log-probabilities.
    tokens: list[TokenLogprob] | None
    #: For a model with reasoning markup (`<think>` ... `</think>` in its vocabulary): whether
    #: this text is its reasoning (the tags included) or its answer. Absent for other models.
    channel: Channel | None


class TokenLogprob(TypedDict):
    """A generated token and its log-probability."""
    #: Token id.
    id: int
    #: Its text.
    text: str
    #: Natural-log probability.
    logprob: float
    #: The most likely alternatives, best first.
    top: list[TopLogprob]


class TopLogprob(TypedDict):
    """An alternative token and its log-probability."""
    #: Token id.
    id: int
    #: Natural-log probability.
    logprob: float


#: The part of a reasoning model's output a delta belongs to.
Channel = Literal['reasoning', 'content']


class CancelRequestParams(TypedDict):
    """Params of `$/cancelRequest`."""
    #: The id of the request to cancel.
    id: RequestId


class _CancelledParamsRequired(TypedDict):
    #: The id of the request to cancel.
    requestId: RequestId


class CancelledParams(_CancelledParamsRequired, total=False):
    """Params of `notifications/cancelled`."""
    #: Why, for logs.
    reason: str | None


class _RequestRequired(TypedDict):
    id: RequestId
    method: str


class Request(_RequestRequired, total=False):
    jsonrpc: Literal['2.0']
    params: dict[str, Any] | list[Any]


class _NotificationRequired(TypedDict):
    method: str


class Notification(_NotificationRequired, total=False):
    jsonrpc: Literal['2.0']
    params: dict[str, Any] | list[Any]


class _ResponseRequired(TypedDict):
    id: RequestId | None


class Response(_ResponseRequired, total=False):
    jsonrpc: Literal['2.0']
    result: Any
    error: ResponseError


#: One JSON-RPC 2.0 message, one per line: a request, a response or a notification.
Message = Union[Request, Notification, Response]


class _ResponseErrorRequired(TypedDict):
    #: The error's number; see [`ErrorCode`] for those the contract defines.
    code: int
    #: A sentence for people: what went wrong and, where possible, what to do.
    message: str


class ResponseError(_ResponseErrorRequired, total=False):
    """The `error` member of a response: `{code, message, data?}`."""
    #: Structured detail; its shape depends on `code` (see [`ErrorCode`]).
    data: Any


class InvalidParamsData(TypedDict):
    """`data` of `-32602 invalid params`."""
    #: The JSON path of the bad field, e.g. `temperature` or `messages[1].content`; `.` for the
    #: params as a whole.
    field: str
    #: What is wrong with it.
    reason: str


class LoadFailedData(TypedDict):
    """`data` of `-32002 model load failed`."""
    #: The class of failure.
    kind: LoadErrorKind
    #: The underlying error, for people.
    detail: str


#: Why a model failed to load: `data.kind` of `-32002`.
LoadErrorKind = Literal['not_found', 'unsupported_architecture', 'invalid_weights', 'tokenizer_missing', 'auth_required', 'network', 'out_of_memory', 'gguf_unsupported']


class BusyData(TypedDict):
    """`data` of `-32003 busy`."""
    #: The queue's capacity (`--max-queue`).
    max_queue: int


class ContextOverflowData(TypedDict):
    """`data` of `-32004 context overflow`."""
    #: Tokens in the templated prompt.
    prompt_tokens: int
    #: The context limit of the model as loaded.
    context_length: int


class GenerationFailedData(TypedDict):
    """`data` of `-32005 generation failed`."""
    #: The MLX error, for people.
    detail: str


class MemoryBudgetData(TypedDict):
    """`data` of `-32006 memory budget`."""
    #: Tokens in the templated prompt.
    prompt_tokens: int
    #: Tokens (prompt and answer together) whose KV cache and activations fit what is left.
    tokens_that_fit: int
    #: Bytes of KV cache and activations the prompt and one answer token need.
    needed_bytes: int
    #: Bytes MLX has left under its memory limit.
    available_bytes: int


#: Every method: its params' and its result's type names.
METHODS: dict[str, tuple[str, str]] = {
    'initialize': ('InitializeParams', 'InitializeResult'),
    'load': ('LoadParams', 'LoadResult'),
    'generate': ('GenerateParams', 'GenerateResult'),
    'cancel': ('CancelParams', 'CancelResult'),
    'unload': ('UnloadParams', 'UnloadResult'),
    'reset': ('ResetParams', 'ResetResult'),
    'status': ('StatusParams', 'StatusResult'),
    'tokenize': ('TokenizeParams', 'TokenizeResult'),
    'cache_list': ('CacheListParams', 'CacheListResult'),
    'cache_pin': ('CachePinParams', 'CachePinResult'),
    'cache_fork': ('CacheForkParams', 'CacheForkResult'),
    'cache_evict': ('CacheEvictParams', 'CacheEvictResult'),
    'shutdown': ('ShutdownParams', 'ShutdownResult'),
}

#: Every notification: its params' type name.
NOTIFICATIONS: dict[str, str] = {
    'load/progress': 'LoadProgress',
    'generate/delta': 'GenerateDelta',
    '$/cancelRequest': 'CancelRequestParams',
    'notifications/cancelled': 'CancelledParams',
}

#: Every error code of the contract: the type name of its `data`, if any.
ERROR_DATA: dict[int, str | None] = {
    -32700: None,
    -32600: None,
    -32601: None,
    -32602: 'InvalidParamsData',
    -32603: None,
    -32001: None,
    -32002: 'LoadFailedData',
    -32003: 'BusyData',
    -32004: 'ContextOverflowData',
    -32005: 'GenerationFailedData',
    -32006: 'MemoryBudgetData',
    -32800: None,
}
