//! Protocol params to engine requests, and engine results to protocol results. Plain data
//! mapping; engine errors are mapped in `errors.rs`.

use mlx_engine::{
    text, Constraint, GenerateRequest, HfToken, LoadRequest, Parallel, Prompt, WeightDtype,
};
use protocol::methods::{
    AutoDrafter, Backend, CacheTier, CacheTierInfo, Channel, ChatMessage, ChatTemplateInfo,
    ChatTemplateSource, ContentPart, DeviceInfo, DiskTierInfo, DraftKind, Dtype, FinishReason,
    FunctionCall, FunctionKind, GenerateDelta, GenerateParams, GenerateResult, GroupInfo,
    KeptConversation, KvQuantization, LoadParams, LoadStage, MemoryInfo, MessageContent, MlxInfo,
    ModelInfo, ParallelInfo, ParallelMode, PromptCacheInfo, Quantization, RankShare, ResidentModel,
    ResponseFormat, SpecialTokens, SpeculativeMethod, Timings, TokenLogprob, ToolCallOut,
    ToolChoice, ToolChoiceMode, TopLogprob, Usage,
};
use protocol::{RequestId, ResponseError};
use serde_json::{json, Map, Value};

/// The engine's load request for `load` params.
pub fn load_request(p: &LoadParams) -> Result<LoadRequest, ResponseError> {
    Ok(LoadRequest {
        model: p.model.clone(),
        revision: Some(p.revision.clone()),
        // The token goes to the engine's hub client and nowhere else (never the environment).
        hf_token: p.hf_token.as_ref().map(|t| HfToken::new(t.expose())),
        max_seq_length: usize::try_from(p.max_seq_length).unwrap_or(usize::MAX),
        load_in_4bit: p.load_in_4bit,
        dtype: p.dtype.map(|d| match d {
            Dtype::Float32 => WeightDtype::Float32,
            Dtype::Float16 => WeightDtype::Float16,
            Dtype::Bfloat16 => WeightDtype::Bfloat16,
        }),
        chat_template_override: p.chat_template_override.clone(),
        adapter: p.adapter.clone(),
        kv_bits: p.kv_bits,
        draft_model: p.draft_model.clone(),
        parallel: p.parallel.map(|m| match m {
            ParallelMode::Tensor => Parallel::Tensor,
            ParallelMode::Pipeline => Parallel::Pipeline,
        }),
        force: p.force,
    })
}

/// The engine's generate request for `generate` params: the system prompt prepended, the
/// template switches as render options, the sampler settings, the adapter switch.
pub fn generate_request(p: &GenerateParams) -> Result<GenerateRequest, ResponseError> {
    let mut messages = messages(&p.messages)?;
    if let Some(image) = &p.image {
        attach_image(&mut messages, image)?;
    }
    let messages = text::prepend_system_prompt(&p.system_prompt, &messages);
    let options = text::RenderOptions {
        add_generation_prompt: p.add_generation_prompt,
        continue_final_message: p.continue_final_message,
        enable_thinking: p.enable_thinking,
        tools: tools(p.tools.as_ref())?,
        extra: template_variables(p.reasoning_effort.as_deref(), p.preserve_thinking),
    };
    let prompt = match &p.prompt_ids {
        Some(ids) => Prompt::Tokens(ids.clone()),
        None => Prompt::Chat { messages, options },
    };
    Ok(GenerateRequest {
        model: p.model.clone(),
        prompt,
        max_new_tokens: p.max_new_tokens as usize,
        // Ranges checked by `Generate::validate`, f32 narrowing included.
        sampler: p.sampling.clone(),
        stop: p.stop.clone(),
        logprobs: usize::from(p.logprobs),
        use_adapter: p.use_adapter,
        constraint: constraint(p),
        tool_choice: match &p.tool_choice {
            None | Some(ToolChoice::Mode(ToolChoiceMode::Auto)) => mlx_engine::ToolChoice::Auto,
            Some(ToolChoice::Mode(ToolChoiceMode::None)) => mlx_engine::ToolChoice::None,
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) => mlx_engine::ToolChoice::Required,
            Some(ToolChoice::Function(f)) => {
                mlx_engine::ToolChoice::Function(f.function.name.clone())
            }
        },
        parallel_tool_calls: p.parallel_tool_calls,
        speculative: p.speculative.as_ref().map(|s| {
            let num_draft_tokens = s.num_draft_tokens.map(|n| n as usize);
            let method = match s.method {
                SpeculativeMethod::PromptLookup => mlx_engine::Drafts::PromptLookup,
                SpeculativeMethod::DraftModel => mlx_engine::Drafts::DraftModel,
                SpeculativeMethod::Mtp => mlx_engine::Drafts::Mtp,
                SpeculativeMethod::Auto => mlx_engine::Drafts::Auto,
            };
            mlx_engine::Speculative {
                method,
                num_draft_tokens,
            }
        }),
        persist: p.cache.as_ref().is_none_or(|c| c.persist),
        conversation: p.cache.as_ref().and_then(|c| c.conversation_id.clone()),
    })
}

/// The request's constraint (`Generate::validate` let at most one through).
fn constraint(p: &GenerateParams) -> Option<Constraint> {
    match (&p.response_format, &p.regex, &p.grammar) {
        (Some(ResponseFormat::JsonObject {}), ..) => Some(Constraint::JsonObject),
        (Some(ResponseFormat::JsonSchema { json_schema }), ..) => {
            Some(Constraint::JsonSchema(json_schema.schema.clone()))
        }
        (_, Some(regex), _) => Some(Constraint::Regex(regex.clone())),
        // GBNF rules are `name ::= ...`; Lark never writes `::=`.
        (_, _, Some(grammar)) if grammar.contains("::=") => Some(Constraint::Gbnf(grammar.clone())),
        (_, _, Some(grammar)) => Some(Constraint::Lark(grammar.clone())),
        _ => None,
    }
}

/// The seed's `image`: the first part of the last user message, before its text. The part
/// names its field, so that an error about the image names `image`.
fn attach_image(messages: &mut [text::Message], image: &str) -> Result<(), ResponseError> {
    let last_user = messages.iter_mut().rev().find(|m| m.role == "user");
    let Some(message) = last_user else {
        return Err(ResponseError::invalid_params(
            "image",
            "there is no user message to attach the image to",
        ));
    };
    let part = json!({"type": "image", "image": image, "field": "image"});
    let parts = match message.content.take() {
        None => vec![part],
        Some(text::MessageContent::Text(s)) => vec![part, json!({"type": "text", "text": s})],
        Some(text::MessageContent::Parts(parts)) => {
            if parts
                .iter()
                .any(|p| p["type"] == "image" || p["type"] == "image_url")
            {
                return Err(ResponseError::invalid_params(
                    "image",
                    "the last user message already has an image part; give the image either \
                     as `image` or as a content part",
                ));
            }
            std::iter::once(part).chain(parts).collect()
        }
    };
    message.content = Some(text::MessageContent::Parts(parts));
    Ok(())
}

/// Chat messages as the chat template sees them; image parts go to the engine, which decodes
/// them for a vision model and refuses them for a text model.
pub fn messages(messages: &[ChatMessage]) -> Result<Vec<text::Message>, ResponseError> {
    let part = |part: &ContentPart| match part {
        ContentPart::Text { text } => json!({"type": "text", "text": text}),
        ContentPart::Image { image } => json!({"type": "image", "image": image}),
        ContentPart::ImageUrl { image_url } => {
            json!({"type": "image_url", "image_url": {"url": image_url.url}})
        }
    };
    Ok(messages
        .iter()
        .map(|m| text::Message {
            role: m.role.clone(),
            content: Some(match &m.content {
                MessageContent::Text(s) => text::MessageContent::Text(s.clone()),
                MessageContent::Parts(parts) => {
                    text::MessageContent::Parts(parts.iter().map(part).collect())
                }
            }),
            extra: m.extra.clone(),
        })
        .collect())
}

/// `reasoning_effort` and `preserve_thinking`: template variables only when given.
pub fn template_variables(
    reasoning_effort: Option<&str>,
    preserve_thinking: Option<bool>,
) -> Map<String, Value> {
    let mut extra = Map::new();
    if let Some(effort) = reasoning_effort {
        extra.insert("reasoning_effort".into(), json!(effort));
    }
    if let Some(preserve) = preserve_thinking {
        extra.insert("preserve_thinking".into(), json!(preserve));
    }
    extra
}

pub fn tools(tools: Option<&Value>) -> Result<Option<Vec<Value>>, ResponseError> {
    match tools {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(tools)) => Ok(Some(tools.clone())),
        Some(_) => Err(ResponseError::invalid_params(
            "tools",
            "must be an array of tool definitions",
        )),
    }
}

/// The `generate` result of a finished (or cancelled) completion.
pub fn generate_result(c: mlx_engine::Completion) -> GenerateResult {
    let u = c.usage;
    let t = c.timings;
    GenerateResult {
        text: c.text,
        finish_reason: match c.finish_reason {
            mlx_engine::FinishReason::Stop => FinishReason::Stop,
            mlx_engine::FinishReason::Length => FinishReason::Length,
            mlx_engine::FinishReason::StopSequence => FinishReason::StopSequence,
            mlx_engine::FinishReason::Cancelled => FinishReason::Cancelled,
            mlx_engine::FinishReason::ToolCalls => FinishReason::ToolCalls,
        },
        tool_calls: c
            .tool_calls
            .into_iter()
            .map(|call| ToolCallOut {
                id: next_call_id(),
                kind: FunctionKind::Function,
                function: FunctionCall {
                    name: call.name,
                    arguments: call.arguments,
                },
            })
            .collect(),
        usage: Usage {
            prompt_tokens: u.prompt_tokens as u64,
            completion_tokens: u.completion_tokens as u64,
            total_tokens: (u.prompt_tokens + u.completion_tokens) as u64,
            cached_tokens: u.cached_tokens as u64,
            cached_images: u.cached_images as u64,
            drafted_tokens: u.drafted_tokens as u64,
            draft_cached_tokens: u.draft_cached_tokens as u64,
            accepted_tokens: u.accepted_tokens as u64,
        },
        timings: Timings {
            prompt_n: t.prompt_n as u64,
            prompt_ms: t.prompt_ms,
            prompt_per_second: per_second(t.prompt_n, t.prompt_ms),
            predicted_n: t.predicted_n as u64,
            predicted_ms: t.predicted_ms,
            predicted_per_second: per_second(t.predicted_n, t.predicted_ms),
            ttft_ms: t.ttft_ms,
        },
    }
}

/// `call_<n>`: unique within this worker's lifetime, as hosts send ids back in `tool` messages.
fn next_call_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "call_{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// A log-probability as JSON can carry it: -inf (and NaN, from a model that computes NaN) is
/// the lowest finite float, as protocol.md says.
fn json_logprob(logprob: f32) -> f32 {
    match logprob.is_finite() {
        true => logprob,
        false => f32::MIN,
    }
}

/// The engine's delta number `index` of request `request_id` as the notification carries it.
pub fn generate_delta(request_id: RequestId, index: u64, d: mlx_engine::Delta) -> GenerateDelta {
    GenerateDelta {
        request_id,
        index,
        text: d.text,
        tokens: delta_tokens(d.tokens),
        channel: d.channel.map(|c| match c {
            mlx_engine::Channel::Reasoning => Channel::Reasoning,
            mlx_engine::Channel::Content => Channel::Content,
        }),
    }
}

/// A delta's `tokens`: present only when log-probabilities were asked for.
fn delta_tokens(tokens: Vec<mlx_engine::TokenLogprob>) -> Option<Vec<TokenLogprob>> {
    (!tokens.is_empty()).then(|| {
        tokens
            .into_iter()
            .map(|t| TokenLogprob {
                id: t.id,
                text: t.text,
                logprob: json_logprob(t.logprob),
                top: t
                    .top
                    .into_iter()
                    .map(|(id, logprob)| TopLogprob {
                        id,
                        logprob: json_logprob(logprob),
                    })
                    .collect(),
            })
            .collect()
    })
}

/// The protocol's name for a load stage.
pub fn load_stage(stage: mlx_engine::LoadStage) -> LoadStage {
    match stage {
        mlx_engine::LoadStage::Resolve => LoadStage::Resolve,
        mlx_engine::LoadStage::Download => LoadStage::Download,
        mlx_engine::LoadStage::Weights => LoadStage::Weights,
        mlx_engine::LoadStage::Tokenizer => LoadStage::Tokenizer,
        mlx_engine::LoadStage::Ready => LoadStage::Ready,
    }
}

/// A resident model's info.
pub fn model_info(info: &mlx_engine::ModelInfo) -> ModelInfo {
    ModelInfo {
        display_name: info.display_name.clone(),
        architecture: info.architecture.clone(),
        model_type: info.model_type.clone(),
        is_vision: info.is_vision,
        is_lora: info.is_lora,
        is_gguf: info.is_gguf,
        dtype: match info.dtype {
            WeightDtype::Float32 => Dtype::Float32,
            WeightDtype::Float16 => Dtype::Float16,
            WeightDtype::Bfloat16 => Dtype::Bfloat16,
        },
        quantization: info.quantization.map(|q| Quantization {
            bits: q.bits as u32,
            group_size: q.group_size as u32,
        }),
        context_length: info.context_length as u64,
        native_context_length: info.native_context_length as u64,
        num_parameters: info.num_parameters,
        vocab_size: info.vocab_size as u64,
        eos_token_ids: info.eos_token_ids.clone(),
        chat_template: ChatTemplateInfo {
            present: info.chat_template_present,
            source: match info.chat_template_source {
                text::ChatTemplateSource::TokenizerConfig => ChatTemplateSource::TokenizerConfig,
                text::ChatTemplateSource::ChatTemplateJinja => {
                    ChatTemplateSource::ChatTemplateJinja
                }
                text::ChatTemplateSource::ChatTemplateJson => ChatTemplateSource::ChatTemplateJson,
                text::ChatTemplateSource::Gguf => ChatTemplateSource::Gguf,
                text::ChatTemplateSource::Override => ChatTemplateSource::Override,
                text::ChatTemplateSource::None => ChatTemplateSource::None,
            },
            text: info.chat_template_text.clone(),
        },
        special_tokens: SpecialTokens {
            bos: info.special_tokens.bos_token.clone(),
            eos: info.special_tokens.eos_token.clone(),
            pad: info.special_tokens.pad_token.clone(),
        },
        kv_quantization: KvQuantization {
            requested: info.kv_bits_requested,
            applied: info.kv_bits,
            reason: info.kv_bits_reason.clone(),
        },
        parallel: info.parallel.as_ref().map(parallel_info),
        mtp_layers: info.mtp_layers as u32,
        draft_kind: info.draft_kind.map(|kind| match kind {
            mlx_engine::DraftKind::Model => DraftKind::Model,
            mlx_engine::DraftKind::Dflash => DraftKind::Dflash,
            mlx_engine::DraftKind::Dflash2 => DraftKind::Dflash2,
            mlx_engine::DraftKind::Dspark => DraftKind::Dspark,
            mlx_engine::DraftKind::Eagle3 => DraftKind::Eagle3,
        }),
        speculative_auto: AutoDrafter {
            method: info.speculative_auto.0.map(|method| match method {
                mlx_engine::Drafts::PromptLookup => SpeculativeMethod::PromptLookup,
                mlx_engine::Drafts::DraftModel => SpeculativeMethod::DraftModel,
                mlx_engine::Drafts::Mtp => SpeculativeMethod::Mtp,
                mlx_engine::Drafts::Auto => SpeculativeMethod::Auto,
            }),
            reason: info.speculative_auto.1.clone(),
        },
        memory: info.memory.clone(),
    }
}

fn parallel_info(p: &mlx_engine::ParallelInfo) -> ParallelInfo {
    ParallelInfo {
        mode: match p.mode {
            Parallel::Tensor => ParallelMode::Tensor,
            Parallel::Pipeline => ParallelMode::Pipeline,
        },
        ranks: p
            .ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| RankShare {
                rank: rank as u32,
                layers: [r.layers.0 as u64, r.layers.1 as u64],
                weight_bytes: r.weight_bytes,
            })
            .collect(),
    }
}

/// `initialize`'s and `status`'s `group`.
pub fn group_info(g: &mlx_engine::GroupInfo) -> GroupInfo {
    GroupInfo {
        backend: g.backend.clone(),
        size: g.size as u32,
        rank: g.rank as u32,
    }
}

/// A `status.models[]` entry.
pub fn resident_model(info: &mlx_engine::ModelInfo) -> ResidentModel {
    ResidentModel {
        model_id: info.model_id.clone(),
        info: model_info(info),
    }
}

/// MLX memory figures.
pub fn memory(m: mlx_engine::MemoryStats) -> MemoryInfo {
    MemoryInfo {
        active_bytes: m.active_bytes,
        peak_bytes: m.peak_bytes,
        limit_bytes: m.limit_bytes,
    }
}

/// `initialize`'s `mlx` member.
pub fn mlx_info(d: &mlx_engine::DeviceInfo) -> MlxInfo {
    MlxInfo {
        version: d.mlx_version.clone(),
        backend: match d.backend {
            mlx_engine::Backend::Metal => Backend::Metal,
            mlx_engine::Backend::Cuda => Backend::Cuda,
            mlx_engine::Backend::Cpu => Backend::Cpu,
        },
        device: DeviceInfo {
            name: d.name.clone(),
            memory_bytes: d.memory_bytes,
            recommended_working_set_bytes: d.recommended_working_set_bytes,
        },
    }
}

/// `status`'s `prompt_cache`.
pub fn prompt_cache(stats: mlx_engine::CacheStats) -> PromptCacheInfo {
    let tier = |t: mlx_engine::TierStats| CacheTierInfo {
        entries: t.entries,
        bytes: t.bytes,
        hits: t.hits,
        hit_tokens: t.hit_tokens,
        hit_rate: match stats.lookups {
            0 => 0.0,
            n => t.hits as f64 / n as f64,
        },
    };
    PromptCacheInfo {
        lookups: stats.lookups,
        memory: tier(stats.memory),
        disk: stats.disk.map(|d| DiskTierInfo {
            tier: tier(d.tier),
            budget_bytes: d.budget_bytes,
            writes: d.counts.writes,
            written_bytes: d.counts.written_bytes,
            skipped_writes: d.counts.skipped_writes,
            rejected: d.counts.rejected,
        }),
    }
}

/// A kept conversation as `cache_list` shows it.
pub fn kept_conversation(c: mlx_engine::Conversation) -> KeptConversation {
    KeptConversation {
        conversation_id: c.conversation_id,
        tokens: c.tokens as u64,
        bytes: c.bytes,
        tier: match c.in_memory {
            true => CacheTier::Memory,
            false => CacheTier::Disk,
        },
        pinned: c.pinned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::error::InvalidParamsData;

    fn field(e: ResponseError) -> String {
        e.data_as::<InvalidParamsData>().unwrap().field
    }

    #[test]
    fn logprobs_json_cannot_carry_become_the_lowest_float() {
        let token = mlx_engine::TokenLogprob {
            id: 7,
            text: "x".into(),
            logprob: f32::NAN,
            top: vec![(7, f32::NEG_INFINITY), (8, -1.5)],
        };
        let out = delta_tokens(vec![token]).unwrap();
        assert_eq!(out[0].logprob, f32::MIN);
        let top: Vec<f32> = out[0].top.iter().map(|t| t.logprob).collect();
        assert_eq!(top, [f32::MIN, -1.5]);
        let json = serde_json::to_string(&out).unwrap();
        assert!(json.contains("-3.4028235e+38"), "{json}");
    }

    #[test]
    fn generate_params_become_an_engine_request() {
        let mut p = GenerateParams::new(vec![ChatMessage::new("user", "hi")]);
        p.system_prompt = "Be brief.".into();
        p.tools = Some(json!([{"type": "function"}]));
        p.enable_thinking = Some(false);
        p.reasoning_effort = Some("high".into());
        p.preserve_thinking = Some(true);
        p.sampling.top_k = -1;
        p.sampling.seed = Some(7);
        p.logprobs = 3;
        let r = generate_request(&p).unwrap();
        let Prompt::Chat { messages, options } = r.prompt else {
            panic!("{:?}", r.prompt)
        };
        assert_eq!(
            messages,
            [
                text::Message::text("system", "Be brief."),
                text::Message::text("user", "hi")
            ]
        );
        assert_eq!(options.tools, Some(vec![json!({"type": "function"})]));
        assert_eq!(options.enable_thinking, Some(false));
        assert_eq!(options.extra["reasoning_effort"], json!("high"));
        assert_eq!(options.extra["preserve_thinking"], json!(true));
        assert!(options.add_generation_prompt);
        assert_eq!((r.sampler.top_k, r.sampler.seed), (-1, Some(7)));
        assert_eq!((r.max_new_tokens, r.logprobs), (256, 3));
    }

    #[test]
    fn the_lone_image_goes_first_in_the_last_user_message() {
        let mut p = GenerateParams::new(vec![
            ChatMessage::new("user", "first"),
            ChatMessage::new("assistant", "ok"),
            ChatMessage::new("user", "what is this?"),
        ]);
        p.image = Some("cat.png".into());
        let Prompt::Chat { messages, .. } = generate_request(&p).unwrap().prompt else {
            panic!("a chat prompt")
        };
        assert_eq!(
            messages[0].content,
            Some(text::MessageContent::Text("first".into()))
        );
        assert_eq!(
            messages[2].content,
            Some(text::MessageContent::Parts(vec![
                json!({"type": "image", "image": "cat.png", "field": "image"}),
                json!({"type": "text", "text": "what is this?"}),
            ]))
        );
    }

    #[test]
    fn image_parts_reach_the_engine_in_order() {
        let p = GenerateParams::new(vec![ChatMessage {
            role: "user".into(),
            content: MessageContent::Parts(vec![
                ContentPart::Text {
                    text: "what".into(),
                },
                ContentPart::Image {
                    image: "a.png".into(),
                },
                ContentPart::ImageUrl {
                    image_url: protocol::methods::ImageUrl {
                        url: "b.png".into(),
                    },
                },
            ]),
            extra: Map::new(),
        }]);
        let Prompt::Chat { messages, .. } = generate_request(&p).unwrap().prompt else {
            panic!("a chat prompt")
        };
        assert_eq!(
            messages[0].content,
            Some(text::MessageContent::Parts(vec![
                json!({"type": "text", "text": "what"}),
                json!({"type": "image", "image": "a.png"}),
                json!({"type": "image_url", "image_url": {"url": "b.png"}}),
            ]))
        );
    }

    #[test]
    fn misplaced_images_and_bad_tools_are_invalid_params() {
        let mut p = GenerateParams::new(vec![ChatMessage::new("system", "hi")]);
        p.image = Some("cat.png".into());
        assert_eq!(field(generate_request(&p).unwrap_err()), "image");

        let mut p = GenerateParams::new(vec![ChatMessage {
            role: "user".into(),
            content: MessageContent::Parts(vec![ContentPart::Image {
                image: "a.png".into(),
            }]),
            extra: Map::new(),
        }]);
        p.image = Some("cat.png".into());
        assert_eq!(field(generate_request(&p).unwrap_err()), "image");

        let mut p = GenerateParams::new(vec![ChatMessage::new("user", "hi")]);
        p.tools = Some(json!({"name": "f"}));
        assert_eq!(field(generate_request(&p).unwrap_err()), "tools");
    }

    #[test]
    fn usage_totals_and_speeds_are_derived() {
        let r = generate_result(mlx_engine::Completion {
            text: "ab".into(),
            token_ids: vec![1, 2],
            finish_reason: mlx_engine::FinishReason::Length,
            tool_calls: Vec::new(),
            usage: mlx_engine::Usage {
                prompt_tokens: 10,
                completion_tokens: 2,
                cached_tokens: 0,
                cached_images: 0,
                drafted_tokens: 4,
                accepted_tokens: 3,
                draft_cached_tokens: 7,
            },
            timings: mlx_engine::Timings {
                prompt_n: 10,
                prompt_ms: 5.0,
                predicted_n: 2,
                predicted_ms: 0.0,
                ttft_ms: 6.0,
            },
        });
        assert_eq!(r.usage.total_tokens, 12);
        assert_eq!((r.usage.drafted_tokens, r.usage.accepted_tokens), (4, 3));
        assert_eq!(r.usage.draft_cached_tokens, 7);
        assert_eq!(r.timings.prompt_per_second, 2000.0);
        assert_eq!(r.timings.predicted_per_second, 0.0);
    }
}
