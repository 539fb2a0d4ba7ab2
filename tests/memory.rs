//! End-to-end: memory as a budget, through the real `mlx-worker` binary on the real SmolLM2
//! (float32, 0.54 GB of weights) under `--memory-limit`. A context that does not fit is fitted
//! to what does; a request past the memory left is refused with `-32006` before anything is
//! allocated, and the model answers as before; a failed load gives back what it took.

use fixtures::smollm2_dir;
use protocol::error::MemoryBudgetData;
use protocol::methods::*;
use protocol::{Client, ErrorCode};

use crate::support::{greedy, model_id, rpc_error, tiny_model, within, within_for, worker};

async fn load(w: &Client, dir: &std::path::Path) -> LoadResult {
    within(w.call::<Load>(&LoadParams::new(model_id(dir))))
        .await
        .unwrap()
}

async fn answer(w: &Client, question: &str) -> String {
    within(w.generate(&greedy(question, 8)).unwrap().finish())
        .await
        .unwrap()
        .text
}

async fn active_bytes(w: &Client) -> u64 {
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    status.memory.active_bytes
}

/// Starts a worker with `--memory-limit`, keeping no prompt cache beside the newest.
fn limited(limit: u64) -> Client {
    worker(&[
        "--memory-limit",
        &limit.to_string(),
        "--prompt-cache-bytes",
        "0",
    ])
}

#[tokio::test]
async fn a_context_that_does_not_fit_is_fitted_to_what_does() {
    let Some(dir) = smollm2_dir() else { return };
    let free = worker(&["--prompt-cache-bytes", "0"]);
    let plan = load(&free, &dir).await.info;
    assert_eq!(plan.context_length, 8192);
    assert_eq!(
        (plan.memory.fitted_from, plan.memory.reason.as_deref()),
        (None, None)
    );
    let capital = answer(&free, "What is the capital of France?").await;
    within(free.shutdown()).await.unwrap();

    // Room for three quarters of what a full context needs beside the weights.
    let full = plan.memory.kv_bytes + plan.memory.compute_bytes;
    let w = limited(plan.memory.weights_bytes + full * 3 / 4);
    let fitted = load(&w, &dir).await.info;
    let context = fitted.context_length;
    assert!(
        (4096..8192).contains(&context) && context % 256 == 0,
        "{context}"
    );
    assert_eq!(fitted.memory.fitted_from, Some(8192));
    let reason = fitted.memory.reason.unwrap();
    assert!(reason.contains("fitted to memory"), "{reason}");
    assert!(fitted.memory.kv_bytes + fitted.memory.compute_bytes <= full * 3 / 4);
    assert_eq!(answer(&w, "What is the capital of France?").await, capital);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_request_past_the_memory_left_is_refused_and_the_model_goes_on() {
    let Some(dir) = smollm2_dir() else { return };
    // 0.16 GB beside the weights: about 1700 tokens, less than the 4096 `load` fits down to.
    let w = limited(700_000_000);
    let info = load(&w, &dir).await.info;
    assert_eq!(info.context_length, 8192);
    let reason = info.memory.reason.unwrap();
    assert!(reason.contains("is refused"), "{reason}");
    let capital = answer(&w, "What is the capital of France?").await;
    let before = active_bytes(&w).await;

    let long = "The quick brown fox jumps over the lazy dog. ".repeat(400);
    let e = rpc_error(
        within(w.generate(&greedy(&long, 8)).unwrap().finish()).await,
        ErrorCode::MemoryBudget,
    );
    let data: MemoryBudgetData = e.data_as().unwrap();
    assert!(data.prompt_tokens > 4000, "{data:?}");
    assert!(data.tokens_that_fit < data.prompt_tokens, "{data:?}");
    assert!(data.needed_bytes > data.available_bytes, "{data:?}");
    assert!(
        e.message.contains("shorten the conversation"),
        "{}",
        e.message
    );
    // Refused at once (it would not fit with the kept conversation gone either): nothing
    // allocated, nothing dropped.
    assert!(active_bytes(&w).await <= before);
    assert_eq!(answer(&w, "What is the capital of France?").await, capital);

    // A load that fails as its weights are read gives back what it took.
    let before = active_bytes(&w).await;
    let damaged = tiny_model(&Default::default());
    let weights = damaged.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() * 3 / 4]).unwrap();
    rpc_error(
        within(w.call::<Load>(&LoadParams::new(model_id(damaged.path())))).await,
        ErrorCode::LoadFailed,
    );
    assert!(active_bytes(&w).await <= before);
    assert_eq!(answer(&w, "What is the capital of France?").await, capital);
    within(w.shutdown()).await.unwrap();
    assert!(w.stray_stdout_lines().is_empty());
}

/// Two long chats at once that fit in memory one at a time but not together: the second waits
/// for the first to end instead of being refused or cut, and answers as it does alone.
#[tokio::test]
async fn a_joiner_that_fits_alone_waits_for_the_rows_beside_it() {
    let Some(dir) = smollm2_dir() else { return };
    let (fox, dog) = (
        "The quick brown fox jumps over the lazy dog. ".repeat(80),
        "A lazy dog sleeps under the old oak tree. ".repeat(80),
    );
    let alone = worker(&["--prompt-cache-bytes", "0"]);
    load(&alone, &dir).await;
    let minute = std::time::Duration::from_secs(60);
    let solo = within_for(minute, alone.generate(&greedy(&dog, 24)).unwrap().finish())
        .await
        .unwrap();
    within(alone.shutdown()).await.unwrap();

    // 0.16 GB beside the weights: about 1700 tokens, one chat of ~900 but not two.
    let w = worker(&[
        "--memory-limit",
        "700000000",
        "--prompt-cache-bytes",
        "0",
        "--max-batch",
        "2",
    ]);
    load(&w, &dir).await;
    let first = w.generate(&greedy(&fox, 24)).unwrap();
    let second = w.generate(&greedy(&dog, 24)).unwrap();
    let (first, second) = within_for(std::time::Duration::from_secs(120), async {
        tokio::join!(first.finish(), second.finish())
    })
    .await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(first.usage.prompt_tokens > 800, "{:?}", first.usage);
    assert_eq!(second.usage.completion_tokens, solo.usage.completion_tokens);
    assert_eq!(second.text, solo.text);
    within(w.shutdown()).await.unwrap();
}
