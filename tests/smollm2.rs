//! End-to-end with the real SmolLM2-135M-Instruct (imported by `cargo xtask setup`) through
//! the binary. Skipped when the model is missing, unless MLX_WORKER_REQUIRE_MODELS=1, which
//! makes a missing model a failure (see `fixtures::smollm2_dir`).

use std::time::Duration;

use crate::support::{chat, greedy, import_cache, model_id, within_for, worker, worker_with_cache};
use fixtures::{smollm2_dir, smollm2_gguf};
use protocol::methods::{ChatTemplateSource, FinishReason, GenerateParams, Load, LoadParams};

/// A 135M model on a slow CPU.
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn smollm2_names_the_capital_of_france() {
    let Some(dir) = smollm2_dir() else { return };
    let w = worker(&[]);
    let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
        .await
        .unwrap();
    assert_eq!(loaded.info.vocab_size, 49152);
    let question = greedy("What is the capital of France?", 20);
    let (deltas, result) = within_for(LIMIT, w.generate(&question).unwrap().collect())
        .await
        .unwrap();
    eprintln!("{:?} {:?}", result.text, result.timings);
    assert!(result.text.contains("Paris"), "{:?}", result.text);
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        result.text
    );
    assert!(matches!(
        result.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ));
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn smollm2_gguf_loads_directly() {
    let Some(gguf) = smollm2_gguf() else { return };
    let cache = import_cache();
    let w = worker_with_cache(cache.path());
    let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&gguf))))
        .await
        .unwrap();
    assert!(loaded.info.is_gguf);
    assert_eq!(loaded.info.chat_template.source, ChatTemplateSource::Gguf);
    answers_paris_and_shuts_down(w).await;
}

#[tokio::test]
async fn smollm2_with_a_quantized_kv_cache_still_answers() {
    let Some(dir) = smollm2_dir() else { return };
    let w = worker(&[]);
    let mut params = LoadParams::new(model_id(&dir));
    params.kv_bits = Some(4);
    within_for(LIMIT, w.call::<Load>(&params)).await.unwrap();
    answers_paris_and_shuts_down(w).await;
}

/// Asks the loaded model for the capital of France (greedy), expects Paris, shuts down.
async fn answers_paris_and_shuts_down(w: protocol::Client) {
    let question = greedy("What is the capital of France?", 20);
    let result = within_for(LIMIT, w.generate(&question).unwrap().finish())
        .await
        .unwrap();
    assert!(result.text.contains("Paris"), "{:?}", result.text);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// Prompt lookup over real pipes: the same text as one token per pass, drafts confirmed and
/// counted in `usage`; a draft count out of range is refused and the worker goes on.
#[tokio::test]
async fn smollm2_prompt_lookup_answers_the_same_with_fewer_passes() {
    let Some(dir) = smollm2_dir() else { return };
    let w = worker(&[]);
    within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
        .await
        .unwrap();
    let mut ask = greedy(
        "Repeat this text exactly, replacing 'fox' with 'cat':\n\nThe quick brown fox jumps \
         over the lazy dog. It was a sunny day in the small village, and the children were \
         playing in the park near the old church.",
        48,
    );
    let plain = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();
    ask.speculative =
        Some(serde_json::from_value(serde_json::json!({"method": "prompt_lookup"})).unwrap());
    let (deltas, fast) = within_for(LIMIT, w.generate(&ask).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(fast.text, plain.text);
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        fast.text
    );
    assert_eq!(plain.usage.drafted_tokens, 0);
    assert!(
        fast.usage.accepted_tokens > 0 && fast.usage.accepted_tokens <= fast.usage.drafted_tokens,
        "{:?}",
        fast.usage
    );

    ask.speculative.as_mut().unwrap().num_draft_tokens = Some(0);
    let err = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("speculative.num_draft_tokens"),
        "{err}"
    );
    answers_paris_and_shuts_down(w).await;
}

/// A chat's next turn with a draft model: the prompt cache kept the draft model's caches with
/// the model's, so it runs only the new turn's tokens (`usage.draft_cached_tokens`, as many as
/// the model's `cached_tokens`), drafts as well as at the first turn (SmolLM2 drafting for
/// itself: every draft but near ties taken; kept caches a position off would be refused
/// everywhere), and answers as without drafts.
#[tokio::test]
async fn the_draft_models_caches_serve_the_next_turn() {
    let Some(dir) = smollm2_dir() else { return };
    let w = worker(&[]);
    let mut load = LoadParams::new(model_id(&dir));
    load.draft_model = Some(model_id(&dir));
    within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
    let speculating = |mut ask: GenerateParams| {
        ask.speculative =
            Some(serde_json::from_value(serde_json::json!({"method": "draft_model"})).unwrap());
        ask
    };
    let question = "Write a short poem about the sea.";
    let first = speculating(greedy(question, 24));
    let first = within_for(LIMIT, w.generate(&first).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(first.usage.draft_cached_tokens, 0, "{:?}", first.usage);
    let turns = [
        ("user", question),
        ("assistant", first.text.as_str()),
        ("user", "Now one about the mountains."),
    ];
    let next = speculating(chat(&turns, 24));
    let fast = within_for(LIMIT, w.generate(&next).unwrap().finish())
        .await
        .unwrap();
    let usage = &fast.usage;
    assert!(usage.cached_tokens > 20, "{usage:?}");
    assert_eq!(usage.draft_cached_tokens, usage.cached_tokens, "{usage:?}");
    assert!(
        usage.accepted_tokens * 10 >= usage.drafted_tokens * 9,
        "{usage:?}"
    );
    let plain = within_for(LIMIT, w.generate(&chat(&turns, 24)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(fast.text, plain.text);
    answers_paris_and_shuts_down(w).await;
}

/// A draft model over real pipes: `draft_model` on `load`, `speculative: draft_model` on
/// `generate` answers what one token per pass answers; without a draft model it is -32602.
#[tokio::test]
async fn smollm2_with_a_draft_model_answers_the_same() {
    let Some(dir) = smollm2_dir() else { return };
    let w = worker(&[]);
    within_for(LIMIT, w.call::<Load>(&LoadParams::new(model_id(&dir))))
        .await
        .unwrap();
    let mut ask = greedy("Write a short poem about the sea.", 32);
    ask.speculative =
        Some(serde_json::from_value(serde_json::json!({"method": "draft_model"})).unwrap());
    let err = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("draft_model"), "{err}");

    let mut load = LoadParams::new(model_id(&dir));
    load.draft_model = Some(model_id(&dir));
    within_for(LIMIT, w.call::<Load>(&load)).await.unwrap();
    let fast = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();
    ask.speculative = None;
    let plain = within_for(LIMIT, w.generate(&ask).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(fast.text, plain.text);
    assert!(fast.usage.accepted_tokens > 0, "{:?}", fast.usage);
    answers_paris_and_shuts_down(w).await;
}
