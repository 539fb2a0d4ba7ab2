//! Params and results: the contract's field names, defaults, and `-32602` for bad fields.

use protocol::error::{InvalidParamsData, LoadFailedData, MemoryBudgetData};
use protocol::methods::*;
use protocol::{ErrorCode, LoadErrorKind, Request, ResponseError, Secret};
use serde_json::{json, Value};

fn bad_field<M: Method>(params: Value) -> InvalidParamsData {
    let err = M::parse_params(&params).expect_err("params should be refused");
    assert_eq!(err.error_code(), Some(ErrorCode::InvalidParams), "{err:?}");
    err.data_as().expect("-32602 carries {field, reason}")
}

#[test]
fn generate_defaults_are_the_contracts() {
    let p =
        Generate::parse_params(&json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
    assert_eq!(p.model, None);
    assert_eq!(p.system_prompt, "");
    assert_eq!(p.image, None);
    assert_eq!(p.max_new_tokens, 256);
    assert_eq!(p.sampling.temperature, 0.7);
    assert_eq!(p.sampling.top_p, 0.9);
    assert_eq!(p.sampling.top_k, 40);
    assert_eq!(p.sampling.min_p, 0.0);
    assert_eq!(p.sampling.repetition_penalty, 1.0);
    assert_eq!(p.sampling.repetition_context_size, 20);
    assert_eq!(p.sampling.presence_penalty, 0.0);
    assert_eq!(p.sampling.frequency_penalty, 0.0);
    assert_eq!(p.sampling.seed, None);
    assert!(p.stop.is_empty());
    assert_eq!(p.use_adapter, None);
    assert_eq!(p.logprobs, 0);
    assert_eq!(p.enable_thinking, None);
    assert!(p.add_generation_prompt);
    assert!(!p.continue_final_message);
    assert_eq!(p, GenerateParams::new(vec![ChatMessage::new("user", "hi")]));
}

#[test]
fn generate_reads_every_field_by_its_contract_name() {
    let p = Generate::parse_params(&json!({
        "model": "m", "system_prompt": "s", "image": "data:x",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": "/p.png"}]},
            {"role": "assistant", "content": "b", "tool_calls": [{"id": 1}]}
        ],
        "max_new_tokens": 5, "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.1,
        "repetition_penalty": 1.1, "repetition_context_size": 64, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "seed": 42, "stop": ["\n\n"], "use_adapter": false,
        "logprobs": 20, "enable_thinking": true, "tools": [{"type": "function"}],
        "add_generation_prompt": false, "continue_final_message": true,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": true}}
    }))
    .unwrap();
    assert_eq!(
        p.response_format,
        Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "n".into(),
                description: None,
                schema: json!({"type": "object"}),
                strict: Some(true),
            }
        })
    );
    assert_eq!(p.max_new_tokens, 5);
    assert_eq!(p.sampling.temperature, 0.0);
    assert_eq!(p.sampling.top_k, -1);
    assert_eq!(p.sampling.seed, Some(42));
    assert_eq!(p.use_adapter, Some(false));
    assert_eq!(p.logprobs, 20);
    assert_eq!(
        p.messages[0].content,
        MessageContent::Parts(vec![
            ContentPart::Text { text: "a".into() },
            ContentPart::Image {
                image: "/p.png".into()
            }
        ])
    );
    assert_eq!(p.messages[1].extra["tool_calls"], json!([{"id": 1}]));
    // Serialising gives the same names back (extra members included).
    let back = serde_json::to_value(&p).unwrap();
    assert_eq!(back["messages"][1]["tool_calls"], json!([{"id": 1}]));
    assert_eq!(back["repetition_context_size"], 64);
    assert_eq!(Generate::parse_params(&back).unwrap(), p);
}

#[test]
fn wrong_types_and_ranges_name_the_field() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({}), "messages"),
        (
            json!({"messages": msgs, "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"messages": msgs, "max_new_tokens": -1}),
            "max_new_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (json!({"messages": msgs, "stop": "x"}), "stop"),
        (json!({"messages": msgs, "logprobs": 21}), "logprobs"),
        (json!({"messages": msgs, "temperature": -1}), "temperature"),
        (json!({"messages": msgs, "top_p": 0}), "top_p"),
        // Sampler settings are a flattened member (`Sampling`): their errors name them too.
        (json!({"messages": msgs, "top_k": 1.5}), "top_k"),
        (json!({"messages": msgs, "seed": -1}), "seed"),
        (
            json!({"messages": msgs, "logit_bias": {"5": "up"}}),
            "logit_bias.5",
        ),
        (json!({"messages": []}), "messages"),
    ];
    for (params, field) in cases {
        let data = bad_field::<Generate>(params.clone());
        assert_eq!(data.field, field, "{params} -> {data:?}");
        assert!(!data.reason.is_empty());
        assert!(!data.reason.contains('\u{1f}'), "{data:?}");
    }
    assert_eq!(bad_field::<Generate>(json!([1, 2])).field, ".");
    assert_eq!(
        bad_field::<Load>(json!({"model": "m", "dtype": "int8"})).field,
        "dtype"
    );
    assert_eq!(
        bad_field::<Load>(json!({"model": "m", "kv_bits": 3})).field,
        "kv_bits"
    );
    assert_eq!(bad_field::<Cancel>(json!({})).field, "request_id");
    assert_eq!(
        bad_field::<Cancel>(json!({"request_id": true})).field,
        "request_id"
    );
    assert_eq!(bad_field::<Tokenize>(json!({})).field, "text");
    assert_eq!(
        bad_field::<Tokenize>(json!({"text": "a", "messages": []})).field,
        "messages"
    );
}

#[test]
fn sampler_settings_must_survive_narrowing_to_f32() {
    // The engine samples in f32: what it would refuse (infinite, or rounded to 0 where 0 is out
    // of range) is refused here, where the error can name the field.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (field, value) in [("temperature", 1e300), ("top_p", 1e-50)] {
        let data = bad_field::<Generate>(json!({"messages": msgs, field: value}));
        assert_eq!(data.field, field, "{data:?}");
        assert!(data.reason.contains("f32"), "{data:?}");
    }
    // Penalties in ranges that keep every logit finite.
    for (field, value) in [
        ("repetition_penalty", 1e300),
        ("repetition_penalty", 1e-50),
        ("repetition_penalty", 0.001),
        ("presence_penalty", 1e30),
        ("frequency_penalty", -101.0),
    ] {
        let data = bad_field::<Generate>(json!({"messages": msgs, field: value}));
        assert_eq!(data.field, field, "{data:?}");
    }
    for (field, value) in [
        ("repetition_penalty", 100.0),
        ("presence_penalty", -100.0),
        ("frequency_penalty", 2.0),
    ] {
        Generate::parse_params(&json!({"messages": msgs, field: value})).unwrap();
    }
    // A tiny temperature rounds to 0, which is in range (greedy).
    let p = Generate::parse_params(&json!({"messages": msgs, "temperature": 1e-50})).unwrap();
    assert_eq!(p.sampling.temperature as f32, 0.0);
}

#[test]
fn absent_params_mean_empty_object() {
    let r = Request::new(1.into(), "status", Value::Null);
    assert_eq!(r.parse_params::<StatusParams>().unwrap(), StatusParams {});
    assert_eq!(Unload::parse_params(&Value::Null).unwrap().model, None);
    assert_eq!(
        Initialize::parse_params(&Value::Null).unwrap(),
        InitializeParams::default()
    );
}

/// A field the worker does not know is refused, never ignored: the host would believe it held.
#[test]
fn unknown_fields_are_refused_by_name() {
    assert_eq!(bad_field::<Reset>(json!({"x": 1})).field, "x");
    assert_eq!(
        bad_field::<Load>(json!({"model": "m", "rope_scaling": 2})).field,
        "rope_scaling"
    );
    let messages = json!([{"role": "user", "content": "hi"}]);
    let generate = bad_field::<Generate>(json!({"messages": messages, "n": 2}));
    assert_eq!(generate.field, "n");
    assert!(
        generate.reason.contains("unknown field"),
        "{}",
        generate.reason
    );
    let nested =
        json!({"messages": messages, "response_format": {"type": "json_object", "schema": {}}});
    // Inside a tagged member serde knows the member, not the path within it.
    let nested = bad_field::<Generate>(nested);
    assert_eq!(nested.field, "response_format");
    assert!(
        nested.reason.contains("unknown field `schema`"),
        "{}",
        nested.reason
    );
}

#[test]
fn one_constraint_per_request() {
    let two = bad_field::<Generate>(json!({
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_object"}, "regex": "a+"
    }));
    assert_eq!(two.field, "regex");
    let text = Generate::parse_params(&json!({
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "text"}, "regex": "a+"
    }));
    assert!(text.is_ok(), "a text format constrains nothing");
    let forced = bad_field::<Generate>(json!({
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "required", "regex": "a+"
    }));
    assert_eq!(forced.field, "tool_choice");
}

#[test]
fn tool_choice_needs_the_tools_it_names() {
    let messages = json!([{"role": "user", "content": "hi"}]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let no_tools = bad_field::<Generate>(json!({"messages": messages, "tool_choice": "required"}));
    assert_eq!(no_tools.field, "tool_choice");
    let unknown = bad_field::<Generate>(json!({
        "messages": messages, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "send_mail"}}
    }));
    assert!(unknown.reason.contains("send_mail"), "{}", unknown.reason);
    let named = Generate::parse_params(&json!({
        "messages": messages, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
    }))
    .unwrap();
    assert!(matches!(named.tool_choice, Some(ToolChoice::Function(_))));
    let auto = Generate::parse_params(&json!({"messages": messages, "tool_choice": "auto"}));
    assert!(auto.is_ok(), "auto needs no tools");
}

#[test]
fn load_defaults_and_hf_token_is_redacted() {
    let p = Load::parse_params(&json!({"model": "org/name", "hf_token": "hf_SECRET"})).unwrap();
    assert_eq!(p.revision, "main");
    assert_eq!(p.max_seq_length, 0);
    assert!(!p.load_in_4bit && !p.trust_remote_code && !p.force);
    assert_eq!(p.dtype, None);
    assert_eq!(p.kv_bits, None);
    assert_eq!(p.hf_token.as_ref().map(Secret::expose), Some("hf_SECRET"));
    let debug = format!("{p:?} {p:#?}");
    assert!(!debug.contains("hf_SECRET"), "{debug}");
    assert!(debug.contains("<redacted>"));
    let p = Load::parse_params(&json!({"model": "m", "dtype": "bfloat16", "kv_bits": 8})).unwrap();
    assert_eq!(p.dtype, Some(Dtype::Bfloat16));
    let mut expected = LoadParams::new("m");
    expected.dtype = Some(Dtype::Bfloat16);
    expected.kv_bits = Some(8);
    assert_eq!(p, expected);
}

fn model_info() -> ModelInfo {
    ModelInfo {
        display_name: "m".into(),
        architecture: "LlamaForCausalLM".into(),
        model_type: "llama".into(),
        is_vision: false,
        is_lora: false,
        is_gguf: false,
        dtype: Dtype::Float16,
        quantization: None,
        context_length: 2048,
        native_context_length: 8192,
        num_parameters: 1,
        vocab_size: 32000,
        eos_token_ids: vec![2],
        chat_template: ChatTemplateInfo {
            present: true,
            source: ChatTemplateSource::ChatTemplateJinja,
            text: Some("{{ messages }}".into()),
        },
        special_tokens: SpecialTokens {
            bos: Some("<s>".into()),
            eos: Some("</s>".into()),
            pad: None,
        },
        kv_quantization: KvQuantization {
            requested: Some(8),
            applied: None,
            reason: Some("heads".into()),
        },
        parallel: None,
        mtp_layers: 0,
        draft_kind: None,
        speculative_auto: AutoDrafter {
            method: Some(SpeculativeMethod::PromptLookup),
            reason: "copies".into(),
        },
        memory: MemoryPlan::default(),
    }
}

#[test]
fn results_use_the_contracts_names() {
    let load = LoadResult {
        model_id: "m".into(),
        info: model_info(),
        load_ms: 3,
        memory: MemoryInfo {
            active_bytes: 1,
            peak_bytes: 2,
            limit_bytes: 3,
        },
    };
    assert_eq!(
        serde_json::to_value(&load).unwrap(),
        json!({
            "model_id": "m", "load_ms": 3,
            "memory": {"active_bytes": 1, "peak_bytes": 2, "limit_bytes": 3},
            "info": {
                "display_name": "m",
                "architecture": "LlamaForCausalLM", "model_type": "llama", "is_vision": false,
                "is_lora": false, "is_gguf": false, "dtype": "float16", "quantization": null,
                "context_length": 2048, "native_context_length": 8192, "num_parameters": 1,
                "vocab_size": 32000,
                "eos_token_ids": [2],
                "chat_template": {
                    "present": true, "source": "chat_template.jinja", "text": "{{ messages }}"
                },
                "special_tokens": {"bos": "<s>", "eos": "</s>", "pad": null},
                "kv_quantization": {"requested": 8, "applied": null, "reason": "heads"},
                "mtp_layers": 0,
                "speculative_auto": {"method": "prompt_lookup", "reason": "copies"},
                "memory": {
                    "weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0,
                    "available_bytes": null, "fitted_from": null, "reason": null
                }
            }
        })
    );

    let generate = GenerateResult {
        text: "hi".into(),
        finish_reason: FinishReason::StopSequence,
        usage: Usage {
            prompt_tokens: 1,
            completion_tokens: 2,
            total_tokens: 3,
            cached_tokens: 0,
            cached_images: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            draft_cached_tokens: 0,
        },
        timings: Timings::default(),
        tool_calls: Vec::new(),
    };
    let v = serde_json::to_value(&generate).unwrap();
    assert_eq!(v["finish_reason"], "stop_sequence");
    assert!(v.get("tool_calls").is_none(), "absent when there are none");
    assert_eq!(v["usage"]["drafted_tokens"], 0);
    // A host that predates speculative decoding's counts still parses usage.
    let old: Usage = serde_json::from_value(serde_json::json!(
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "cached_tokens": 0}
    ))
    .unwrap();
    assert_eq!((old.accepted_tokens, old.cached_images), (0, 0));
    let timing_keys: Vec<&str> = v["timings"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        timing_keys,
        [
            "prompt_n",
            "prompt_ms",
            "prompt_per_second",
            "predicted_n",
            "predicted_ms",
            "predicted_per_second",
            "ttft_ms"
        ]
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "cached_tokens": 0,
               "cached_images": 0, "drafted_tokens": 0, "accepted_tokens": 0,
               "draft_cached_tokens": 0})
    );

    let status = StatusResult {
        state: WorkerState::Generating,
        active_model: None,
        models: vec![ResidentModel {
            model_id: "m".into(),
            info: model_info(),
        }],
        queue: QueueInfo {
            running: 1,
            waiting: 2,
        },
        memory: MemoryInfo::default(),
        uptime_ms: 5,
        requests_served: 6,
        prompt_cache: PromptCacheInfo {
            lookups: 4,
            memory: CacheTierInfo {
                entries: 1,
                bytes: 10,
                hits: 1,
                hit_tokens: 7,
                hit_rate: 0.25,
            },
            disk: Some(DiskTierInfo {
                tier: CacheTierInfo {
                    entries: 2,
                    bytes: 20,
                    hits: 2,
                    hit_tokens: 9,
                    hit_rate: 0.5,
                },
                budget_bytes: 100,
                writes: 3,
                written_bytes: 30,
                skipped_writes: 0,
                rejected: 1,
            }),
        },
        group: Some(GroupInfo {
            backend: "ring".into(),
            size: 2,
            rank: 0,
        }),
    };
    let v = serde_json::to_value(&status).unwrap();
    assert_eq!(v["group"], json!({"backend": "ring", "size": 2, "rank": 0}));
    // A model not split over ranks says nothing of it.
    assert!(v["models"][0].get("parallel").is_none());
    assert_eq!(v["state"], "generating");
    assert_eq!(v["active_model"], Value::Null);
    assert_eq!(v["models"][0]["model_id"], "m");
    assert_eq!(v["models"][0]["context_length"], 2048);
    assert_eq!(v["queue"], json!({"running": 1, "waiting": 2}));
    // The disk tier's figures sit beside its own as the memory tier's do.
    assert_eq!(
        v["prompt_cache"]["disk"],
        json!({"entries": 2, "bytes": 20, "hits": 2, "hit_tokens": 9, "hit_rate": 0.5,
               "budget_bytes": 100, "writes": 3, "written_bytes": 30, "skipped_writes": 0,
               "rejected": 1})
    );
    assert_eq!(serde_json::from_value::<StatusResult>(v).unwrap(), status);

    let init = InitializeResult {
        protocol_version: PROTOCOL_VERSION.into(),
        worker: ProgramInfo {
            name: "mlx-worker".into(),
            version: "0.1.0".into(),
        },
        mlx: MlxInfo {
            version: "0.29".into(),
            backend: Backend::Cpu,
            device: DeviceInfo {
                name: "cpu".into(),
                memory_bytes: 1,
                recommended_working_set_bytes: None,
            },
        },
        capabilities: Capabilities {
            architectures: vec!["llama".into()],
            vision: false,
            lora: true,
            gguf: true,
            max_queue: 16,
            max_batch: 4,
            batch_attention: BatchAttention::Rows,
        },
        group: None,
    };
    let v = serde_json::to_value(&init).unwrap();
    assert_eq!(v["protocol_version"], "1");
    assert!(v.get("group").is_none(), "one process names no group");
    assert_eq!(v["mlx"]["backend"], "cpu");
    assert_eq!(v["capabilities"]["max_queue"], 16);
    assert_eq!(v["capabilities"]["max_batch"], 4);

    assert_eq!(serde_json::to_value(ShutdownResult {}).unwrap(), json!({}));
    assert_eq!(
        serde_json::to_value(CancelResult { cancelled: true }).unwrap(),
        json!({"cancelled": true})
    );
    assert_eq!(
        serde_json::to_value(TokenizeResult {
            tokens: vec![1, 2],
            count: 2,
            prompt: None
        })
        .unwrap(),
        json!({"tokens": [1, 2], "count": 2})
    );
    assert_eq!(
        serde_json::to_value(UnloadResult {
            unloaded: vec!["m".into()],
            memory: MemoryInfo::default()
        })
        .unwrap()["unloaded"],
        json!(["m"])
    );
}

#[test]
fn notifications_use_the_contracts_names() {
    let delta = GenerateDelta {
        request_id: 7.into(),
        index: 0,
        text: "a".into(),
        tokens: None,
        channel: None,
    };
    assert_eq!(
        serde_json::to_value(&delta).unwrap(),
        json!({"request_id": 7, "index": 0, "text": "a"})
    );
    let reasoning = GenerateDelta {
        channel: Some(Channel::Reasoning),
        ..delta.clone()
    };
    assert_eq!(
        serde_json::to_value(&reasoning).unwrap()["channel"],
        "reasoning"
    );
    let delta = GenerateDelta {
        tokens: Some(vec![TokenLogprob {
            id: 1,
            text: "a".into(),
            logprob: -0.5,
            top: vec![TopLogprob {
                id: 1,
                logprob: -0.5,
            }],
        }]),
        ..delta
    };
    assert_eq!(
        serde_json::to_value(&delta).unwrap()["tokens"],
        json!([{"id": 1, "text": "a", "logprob": -0.5, "top": [{"id": 1, "logprob": -0.5}]}])
    );
    let progress: LoadProgress = serde_json::from_value(
        json!({"request_id": "l", "stage": "download", "done": 1, "total": 2, "message": "x"}),
    )
    .unwrap();
    assert_eq!(progress.stage, LoadStage::Download);
    let c: CancelledParams =
        serde_json::from_value(json!({"requestId": 3, "reason": "user"})).unwrap();
    assert_eq!(c.request_id, 3.into());
    let c: CancelRequestParams = serde_json::from_value(json!({"id": "x"})).unwrap();
    assert_eq!(c.id, "x".into());
    assert_eq!(GenerateDeltaNotification::NAME, "generate/delta");
    assert_eq!(LoadProgressNotification::NAME, "load/progress");
    assert_eq!(CancelRequestNotification::NAME, "$/cancelRequest");
    assert_eq!(CancelledNotification::NAME, "notifications/cancelled");
}

#[test]
fn error_codes_and_data() {
    let codes: Vec<i64> = ErrorCode::ALL.iter().map(|c| c.code()).collect();
    assert_eq!(
        codes,
        [
            -32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003, -32004, -32005, -32006,
            -32800
        ]
    );
    let e = ResponseError::load_failed(LoadErrorKind::AuthRequired, "gated");
    assert_eq!(e.code, -32002);
    assert_eq!(
        e.data,
        Some(json!({"kind": "auth_required", "detail": "gated"}))
    );
    assert_eq!(
        e.data_as::<LoadFailedData>().unwrap().kind,
        LoadErrorKind::AuthRequired
    );
    for kind in [
        "not_found",
        "unsupported_architecture",
        "invalid_weights",
        "tokenizer_missing",
        "auth_required",
        "network",
        "out_of_memory",
        "gguf_unsupported",
    ] {
        let k: LoadErrorKind = serde_json::from_value(json!(kind)).unwrap();
        assert_eq!(k.as_str(), kind);
    }
    assert_eq!(ResponseError::busy(16).data, Some(json!({"max_queue": 16})));
    assert_eq!(
        ResponseError::context_overflow(9, 8).data,
        Some(json!({"prompt_tokens": 9, "context_length": 8}))
    );
    let budget = MemoryBudgetData {
        prompt_tokens: 4000,
        tokens_that_fit: 1700,
        needed_bytes: 350,
        available_bytes: 160,
    };
    let e = ResponseError::memory_budget("too big", budget.clone());
    assert_eq!(e.code, -32006);
    assert_eq!(
        e.data,
        Some(
            json!({"prompt_tokens": 4000, "tokens_that_fit": 1700, "needed_bytes": 350,
                    "available_bytes": 160})
        )
    );
    assert_eq!(e.data_as::<MemoryBudgetData>().unwrap(), budget);
    assert_eq!(
        ResponseError::generation_failed("oom").data,
        Some(json!({"detail": "oom"}))
    );
    assert_eq!(ResponseError::request_cancelled().code, -32800);
    assert_eq!(ResponseError::no_model(None).code, -32001);
    assert_eq!(ResponseError::method_not_found("x").code, -32601);
    let audio = ResponseError::method_not_found("generate_audio_input");
    assert!(
        audio.message.contains("audio is not supported"),
        "{}",
        audio.message
    );
    assert_eq!(ResponseError::internal("x").code, -32603);
    // `data` is omitted when absent.
    assert_eq!(
        serde_json::to_value(ResponseError::internal("x"))
            .unwrap()
            .get("data"),
        None
    );
}
