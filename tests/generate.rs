//! End-to-end: the real `mlx-worker` binary over real pipes, running real MLX on tiny random
//! Llamas (`fixtures`): load, generate, tokenize, stop sequences and every error a
//! model request can get.

use crate::support::{
    greedy, model_id, rpc_error, tiny_model, within, within_for, worker, worker_with_tiny_model,
};
use fixtures::{TinyLlama, FIRST_BYTE_ID, VOCAB_SIZE};
use protocol::error::{ContextOverflowData, InvalidParamsData, LoadFailedData};
use protocol::methods::*;
use protocol::{ErrorCode, LoadErrorKind};
use std::time::Duration;

const PROMPT: &str = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
/// Its tokens: three special tokens and one per byte of the rest.
const PROMPT_TOKENS: u64 = 3 + "user\nhi\nassistant\n".len() as u64;

#[tokio::test]
async fn load_generate_and_tokenize_a_tiny_model() {
    let dir = tiny_model(&TinyLlama::default());
    let id = model_id(dir.path());
    let w = worker(&[]);

    let init = within(w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert_eq!(init.mlx.backend, Backend::Cpu);
    assert!(!init.mlx.version.is_empty());
    assert!(!init.mlx.device.name.is_empty());
    assert!(init.capabilities.architectures.contains(&"llama".into()));
    assert!(init.capabilities.vision && init.capabilities.lora && init.capabilities.gguf);
    assert!(init.mlx.device.memory_bytes > 0);

    // load: the result describes the model; progress runs from resolve to ready.
    let mut params = LoadParams::new(&id);
    params.hf_token = Some("hf_secret_never_logged".to_owned().into());
    let loaded = within(w.call::<Load>(&params)).await.unwrap();
    assert_eq!(loaded.model_id, id);
    let info = &loaded.info;
    assert_eq!(
        (info.architecture.as_str(), info.model_type.as_str()),
        ("llama", "llama")
    );
    assert_eq!(info.dtype, Dtype::Float32);
    assert_eq!(info.quantization, None);
    assert_eq!(
        (info.context_length, info.vocab_size),
        (4096, VOCAB_SIZE as u64)
    );
    assert_eq!(info.eos_token_ids, [2]);
    assert!(info.num_parameters > 50_000, "{}", info.num_parameters);
    assert_eq!(
        (info.chat_template.present, info.chat_template.source),
        (true, ChatTemplateSource::TokenizerConfig)
    );
    let template = info.chat_template.text.as_deref().unwrap();
    assert!(template.contains("<|im_start|>"), "{template}");
    assert_eq!(info.special_tokens.eos.as_deref(), Some("<|im_end|>"));
    assert_eq!(info.special_tokens.pad.as_deref(), Some("<|endoftext|>"));
    assert_eq!(info.special_tokens.bos, None);
    assert_eq!(
        info.display_name,
        dir.path().file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(info.kv_quantization, KvQuantization::default());
    assert!(loaded.memory.active_bytes > 0);
    let mut stages = Vec::new();
    while stages.last() != Some(&LoadStage::Ready) {
        let n = within(w.next_notification()).await.unwrap();
        assert_eq!(n.method, "load/progress");
        let p: LoadProgress = n.parse_params().unwrap();
        stages.push(p.stage);
    }
    for stage in [LoadStage::Resolve, LoadStage::Tokenizer, LoadStage::Weights] {
        assert!(stages.contains(&stage), "{stages:?}");
    }

    // generate: deltas in order, their concatenation is the text, usage and timings add up.
    let (deltas, result) = within(w.generate(&greedy("hi", 24)).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(
        deltas.iter().map(|d| d.index).collect::<Vec<_>>(),
        (0..deltas.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        result.text
    );
    assert!(!result.text.is_empty());
    assert_eq!(result.finish_reason, FinishReason::Length);
    let u = &result.usage;
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.total_tokens),
        (PROMPT_TOKENS, 24, PROMPT_TOKENS + 24)
    );
    let t = &result.timings;
    assert_eq!((t.prompt_n, t.predicted_n), (u.prompt_tokens, 24));
    assert!(
        t.prompt_ms > 0.0 && t.predicted_ms > 0.0 && t.ttft_ms > 0.0,
        "{t:?}"
    );
    assert!(
        t.prompt_per_second > 0.0 && t.predicted_per_second > 0.0,
        "{t:?}"
    );

    // Greedy is deterministic; so is sampling with a seed.
    let again = within(w.generate(&greedy("hi", 24)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(again.text, result.text);
    let sampled = |seed| {
        let mut p = greedy("hi", 24);
        (p.sampling.temperature, p.sampling.seed) = (1.0, Some(seed));
        p
    };
    let a = within(w.generate(&sampled(42)).unwrap().finish())
        .await
        .unwrap();
    let b = within(w.generate(&sampled(42)).unwrap().finish())
        .await
        .unwrap();
    let c = within(w.generate(&sampled(43)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(a.text, b.text);
    assert_ne!(a.text, c.text);

    // Log-probabilities ride on the deltas when asked for.
    let mut p = greedy("hi", 4);
    p.logprobs = 2;
    let (deltas, _) = within(w.generate(&p).unwrap().collect()).await.unwrap();
    let tokens: Vec<TokenLogprob> = deltas
        .into_iter()
        .flat_map(|d| d.tokens.into_iter().flatten())
        .collect();
    assert_eq!(tokens.len(), 4);
    assert!(tokens.iter().all(|t| t.top.len() == 2 && t.logprob <= 0.0));
    // Greedy: the chosen token is the most likely one.
    assert!(tokens.iter().all(|t| t.top[0].id == t.id), "{tokens:?}");

    // tokenize: bytes are ids FIRST_BYTE_ID + b; messages go through the ChatML template.
    let r = within(w.call::<Tokenize>(&TokenizeParams::text("ab")))
        .await
        .unwrap();
    assert_eq!(r.tokens, [FIRST_BYTE_ID + 97, FIRST_BYTE_ID + 98]);
    assert_eq!((r.count, r.prompt), (2, None));
    let mut p = TokenizeParams::text("");
    (p.text, p.messages) = (None, Some(vec![ChatMessage::new("user", "hi")]));
    let r = within(w.call::<Tokenize>(&p)).await.unwrap();
    assert_eq!(r.prompt.as_deref(), Some(PROMPT));
    assert_eq!(r.count as u64, PROMPT_TOKENS);
    assert_eq!(r.tokens[0], 1);
    // With generate's template inputs, a count is the prompt generate runs.
    p.system_prompt = "Be brief.".into();
    let with_system = within(w.call::<Tokenize>(&p)).await.unwrap();
    let mut g = greedy("hi", 1);
    g.system_prompt = "Be brief.".into();
    let ran = within(w.generate(&g).unwrap().finish()).await.unwrap();
    assert_eq!(with_system.count as u64, ran.usage.prompt_tokens);
    assert!(with_system
        .prompt
        .unwrap()
        .starts_with("<|im_start|>system\nBe brief."));

    // A raw completion: `prompt_ids` is the prompt as it is, no template.
    let mut raw = GenerateParams::new(vec![]);
    (raw.prompt_ids, raw.max_new_tokens, raw.sampling.temperature) =
        (Some(r.tokens.clone()), 24, 0.0);
    let completed = within(w.generate(&raw).unwrap().finish()).await.unwrap();
    assert_eq!(completed.usage.prompt_tokens, PROMPT_TOKENS);
    assert_eq!(completed.text, result.text);
    raw.prompt_ids = Some(vec![VOCAB_SIZE as u32]);
    let err = within(w.generate(&raw).unwrap().finish())
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("prompt_ids"), "{err:?}");
    // A raw prompt has no template: a template input is refused, not dropped.
    (raw.prompt_ids, raw.system_prompt) = (Some(r.tokens.clone()), "Be brief.".into());
    let err = within(w.generate(&raw).unwrap().finish())
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("system_prompt"), "{err:?}");

    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.active_model.as_deref(), Some(id.as_str()));
    assert_eq!(status.models.len(), 1);
    assert_eq!(status.models[0].info, loaded.info);

    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
    assert!(
        w.stray_stdout_lines().is_empty(),
        "{:?}",
        w.stray_stdout_lines()
    );
    assert!(!w.stderr_tail().contains("hf_secret_never_logged"));
}

#[tokio::test]
async fn stop_sequences_end_the_text_and_are_never_emitted() {
    let (w, _dir) = worker_with_tiny_model(&[]).await;
    let full = within(w.generate(&greedy("hi", 40)).unwrap().finish())
        .await
        .unwrap()
        .text;
    // A two-character stop that first occurs after the start (greedy text is ASCII).
    let (at, stop) = (1..full.len() - 1)
        .map(|i| (i, &full[i..i + 2]))
        .find(|&(i, stop)| full.find(stop) == Some(i))
        .unwrap_or_else(|| panic!("no stop sequence to pick in {full:?}"));
    let expected = &full[..at];
    let mut p = greedy("hi", 40);
    p.stop = vec![stop.to_owned()];
    let (deltas, result) = within(w.generate(&p).unwrap().collect()).await.unwrap();
    assert_eq!(result.finish_reason, FinishReason::StopSequence);
    assert_eq!(result.text, expected, "stop {stop:?} in {full:?}");
    let streamed: String = deltas.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(streamed, result.text);
    assert!(!streamed.contains(stop));
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn bad_requests_fail_with_their_codes_and_the_resident_model_stays_usable() {
    let (w, dir) = worker_with_tiny_model(&[]).await;
    let field = |e: protocol::ResponseError| e.data_as::<InvalidParamsData>().unwrap().field;

    // Sampling params out of range: refused before they reach the queue, or by the engine.
    let mut p = greedy("hi", 4);
    p.sampling.top_p = 2.0;
    let e = rpc_error(
        w.generate(&p).unwrap().finish().await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(field(e), "top_p");
    // An image for a text model is refused, naming the field.
    let mut p = greedy("hi", 4);
    p.image = Some("cat.png".into());
    let e = rpc_error(
        w.generate(&p).unwrap().finish().await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(field(e), "image");

    // Failed loads say why, and leave the resident model as it was.
    let missing = dir.path().join("no-such-model");
    let e = rpc_error(
        w.call::<Load>(&LoadParams::new(model_id(&missing))).await,
        ErrorCode::LoadFailed,
    );
    assert_eq!(
        e.data_as::<LoadFailedData>().unwrap().kind,
        LoadErrorKind::NotFound
    );
    let rwkv = tiny_model(&TinyLlama {
        model_type: "rwkv7".into(),
        ..TinyLlama::default()
    });
    let e = rpc_error(
        w.call::<Load>(&LoadParams::new(model_id(rwkv.path())))
            .await,
        ErrorCode::LoadFailed,
    );
    let data: LoadFailedData = e.data_as().unwrap();
    assert_eq!(data.kind, LoadErrorKind::UnsupportedArchitecture);
    assert!(data.detail.contains("rwkv7"), "{}", data.detail);
    // kv_bits quantizes heads in groups of 64 features; the tiny model's heads have 16: it
    // loads with a plain cache and says why; its greedy text is the plain cache's.
    let plain = within(w.generate(&greedy("hi", 6)).unwrap().finish())
        .await
        .unwrap();
    let mut kv = LoadParams::new(model_id(dir.path()));
    kv.kv_bits = Some(8);
    let loaded = within(w.call::<Load>(&kv)).await.unwrap();
    let q = loaded.info.kv_quantization;
    assert_eq!((q.requested, q.applied), (Some(8), None));
    assert!(q.reason.unwrap().contains("multiple of 64"));
    let r = within(w.generate(&greedy("hi", 6)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(r.text, plain.text);
    kv.kv_bits = Some(3);
    assert_eq!(
        field(rpc_error(
            w.call::<Load>(&kv).await,
            ErrorCode::InvalidParams
        )),
        "kv_bits"
    );
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.active_model, Some(model_id(dir.path())));
    let r = within(w.generate(&greedy("hi", 4)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(r.usage.completion_tokens, 4);

    // A prompt longer than the context limit.
    let short = tiny_model(&TinyLlama {
        seed: 1,
        ..TinyLlama::default()
    });
    let mut p = LoadParams::new(model_id(short.path()));
    p.max_seq_length = 8;
    let loaded = within(w.call::<Load>(&p)).await.unwrap();
    assert_eq!(loaded.info.context_length, 8);
    let e = rpc_error(
        w.generate(&greedy("hi", 4)).unwrap().finish().await,
        ErrorCode::ContextOverflow,
    );
    let data: ContextOverflowData = e.data_as().unwrap();
    assert_eq!(data.context_length, 8);
    assert!(data.prompt_tokens > 8, "{data:?}");
    // The first model is still there by name.
    let mut p = greedy("hi", 4);
    p.model = Some(model_id(dir.path()));
    within(w.generate(&p).unwrap().finish()).await.unwrap();

    // A chat template that refuses the messages: -32602 naming `messages`, for `generate`
    // and for `tokenize`.
    let refusing = tiny_model(&TinyLlama {
        seed: 2,
        ..TinyLlama::default()
    });
    let mut p = LoadParams::new(model_id(refusing.path()));
    p.chat_template_override = Some("{{ raise_exception('no chat here') }}".into());
    let loaded = within(w.call::<Load>(&p)).await.unwrap();
    assert_eq!(
        loaded.info.chat_template.source,
        ChatTemplateSource::Override
    );
    let e = rpc_error(
        w.generate(&greedy("hi", 4)).unwrap().finish().await,
        ErrorCode::InvalidParams,
    );
    assert!(e.message.contains("no chat here"), "{}", e.message);
    assert_eq!(field(e), "messages");
    let mut p = TokenizeParams::text("");
    (p.text, p.messages) = (None, Some(vec![ChatMessage::new("user", "hi")]));
    let e = rpc_error(w.call::<Tokenize>(&p).await, ErrorCode::InvalidParams);
    assert_eq!(field(e), "messages");

    // A chat template that loops without end runs out of fuel: -32602, and the worker goes on.
    let mut p = LoadParams::new(model_id(refusing.path()));
    p.chat_template_override = Some(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}".into(),
    );
    within(w.call::<Load>(&p)).await.unwrap();
    let e = rpc_error(
        within_for(
            Duration::from_secs(60),
            w.generate(&greedy("hi", 4)).unwrap().finish(),
        )
        .await,
        ErrorCode::InvalidParams,
    );
    assert!(e.message.contains("loop without end"), "{}", e.message);
    let mut p = greedy("hi", 4);
    p.model = Some(model_id(dir.path()));
    within(w.generate(&p).unwrap().finish()).await.unwrap();

    // After unloading everything, model requests answer -32001.
    let r = within(w.call::<Unload>(&UnloadParams::default()))
        .await
        .unwrap();
    assert_eq!(r.unloaded.len(), 3);
    rpc_error(
        w.generate(&greedy("hi", 4)).unwrap().finish().await,
        ErrorCode::NoModel,
    );
    rpc_error(
        w.call::<Tokenize>(&TokenizeParams::text("ab")).await,
        ErrorCode::NoModel,
    );
    within(w.shutdown()).await.unwrap();
    assert!(w.stray_stdout_lines().is_empty());
}

#[tokio::test]
async fn load_options_quantize_cast_and_unload_frees_memory() {
    let dir = tiny_model(&TinyLlama::default());
    let w = worker(&[]);
    let question = greedy("hi", 8);

    // Quantize on load: affine 4-bit, group 64; the model still generates.
    let mut params = LoadParams::new(model_id(dir.path()));
    params.load_in_4bit = true;
    let loaded = within(w.call::<Load>(&params)).await.unwrap();
    let q = loaded.info.quantization.expect("quantized on load");
    assert_eq!((q.bits, q.group_size), (4, 64));
    let quantized_bytes = loaded.memory.active_bytes;
    let text = within(w.generate(&question).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(text.usage.completion_tokens, 8);

    // dtype: bfloat16 weights, reloaded with `force`.
    let mut params = LoadParams::new(model_id(dir.path()));
    params.dtype = Some(Dtype::Bfloat16);
    params.force = true;
    let loaded = within(w.call::<Load>(&params)).await.unwrap();
    assert_eq!(loaded.info.dtype, Dtype::Bfloat16);
    assert!(loaded.info.quantization.is_none());
    within(w.generate(&question).unwrap().finish())
        .await
        .unwrap();

    // Unload frees the weights: active memory falls below what the 4-bit model held.
    let unloaded = within(w.call::<Unload>(&UnloadParams::default()))
        .await
        .unwrap();
    assert_eq!(unloaded.unloaded, vec![model_id(dir.path())]);
    assert!(
        unloaded.memory.active_bytes < quantized_bytes,
        "{} >= {quantized_bytes}",
        unloaded.memory.active_bytes
    );
    rpc_error(
        within(w.generate(&question).unwrap().finish()).await,
        ErrorCode::NoModel,
    );
}

#[tokio::test]
async fn logit_bias_steers_greedy_decoding() {
    let (w, _dir) = worker_with_tiny_model(&[]).await;
    let mut params = greedy("hi", 6);
    params
        .sampling
        .logit_bias
        .insert((FIRST_BYTE_ID + u32::from(b'Z')).to_string(), 100.0);
    let result = within(w.generate(&params).unwrap().finish()).await.unwrap();
    assert_eq!(result.text, "ZZZZZZ");
    params.sampling.logit_bias = [("not-an-id".to_owned(), 1.0)].into();
    let e = rpc_error(
        within(w.generate(&params).unwrap().finish()).await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(
        e.data_as::<InvalidParamsData>().unwrap().field,
        "logit_bias"
    );
}
