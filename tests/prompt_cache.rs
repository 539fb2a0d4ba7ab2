//! End-to-end: the prompt cache through the real `mlx-worker` binary on a tiny random Llama.
//! A chat's next turn reuses the KV caches of the turn before (`usage.cached_tokens`, only the
//! rest is prefilled: `timings.prompt_n`), answers what a fresh worker answers, and `reset`
//! forgets the cache.

use crate::support::{self, model_id, tiny_model, within, worker};
use fixtures::TinyLlama;
use protocol::methods::*;
use protocol::Client;

fn chat(turns: &[(&str, &str)]) -> GenerateParams {
    support::chat(turns, 16)
}

async fn ask(w: &Client, p: &GenerateParams) -> GenerateResult {
    within(w.generate(p).unwrap().finish()).await.unwrap()
}

async fn loaded_worker(dir: &std::path::Path) -> Client {
    let w = worker(&[]);
    within(w.call::<Load>(&LoadParams::new(model_id(dir))))
        .await
        .unwrap();
    w
}

#[tokio::test]
async fn the_next_turn_reuses_the_last_turns_cache_and_answers_the_same() {
    let dir = tiny_model(&TinyLlama::default());
    let w = loaded_worker(dir.path()).await;

    let first = ask(&w, &chat(&[("user", "Name three colours.")])).await;
    assert_eq!(first.usage.cached_tokens, 0);
    assert_eq!(first.timings.prompt_n, first.usage.prompt_tokens);

    let turns = [
        ("user", "Name three colours."),
        ("assistant", first.text.as_str()),
        ("user", "And three more?"),
    ];
    let second = ask(&w, &chat(&turns)).await;
    // At least the whole first prompt is shared (the template renders the reply after it).
    assert!(
        second.usage.cached_tokens >= first.usage.prompt_tokens,
        "{:?} after {:?}",
        second.usage,
        first.usage
    );
    assert!(second.usage.cached_tokens < second.usage.prompt_tokens);
    assert_eq!(
        second.timings.prompt_n,
        second.usage.prompt_tokens - second.usage.cached_tokens
    );

    // A fresh worker, computing the whole prompt, answers the same.
    let fresh = loaded_worker(dir.path()).await;
    let uncached = ask(&fresh, &chat(&turns)).await;
    assert_eq!(uncached.usage.cached_tokens, 0);
    assert_eq!(uncached.text, second.text);
    fresh.shutdown().await.unwrap();

    // The same prompt again: everything but its last token is reused.
    let again = ask(&w, &chat(&turns)).await;
    assert_eq!(again.usage.cached_tokens, again.usage.prompt_tokens - 1);
    assert_eq!(again.text, second.text);

    // `reset` with `prompt_cache: false` (Studio's, after every stopped reply) keeps it.
    within(w.call::<Reset>(&ResetParams {
        prompt_cache: false,
    }))
    .await
    .unwrap();
    let kept = ask(&w, &chat(&turns)).await;
    assert_eq!(kept.usage.cached_tokens, kept.usage.prompt_tokens - 1);
    assert_eq!(kept.text, second.text);

    // `reset` forgets the cache.
    within(w.call::<Reset>(&ResetParams::default()))
        .await
        .unwrap();
    let after_reset = ask(&w, &chat(&turns)).await;
    assert_eq!(after_reset.usage.cached_tokens, 0);
    assert_eq!(after_reset.text, second.text);
    w.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_different_conversation_starts_from_the_shared_prefix_only() {
    let dir = tiny_model(&TinyLlama::default());
    let w = loaded_worker(dir.path()).await;
    let a = ask(&w, &chat(&[("user", "abc")])).await;
    // The template's "<|im_start|>user\n" is shared (one special token, then one per byte);
    // the rest is not.
    let b = ask(&w, &chat(&[("user", "xyz")])).await;
    assert_eq!(b.usage.prompt_tokens, a.usage.prompt_tokens);
    assert_eq!(
        b.usage.cached_tokens,
        1 + "user\n".len() as u64,
        "{:?}",
        b.usage
    );
    w.shutdown().await.unwrap();
}

/// Two chats taking turns: each next turn reuses its own chat's caches (kept side by side, least
/// recently used first out), and answers what a fresh worker answers.
#[tokio::test]
async fn two_conversations_taking_turns_both_reuse_their_prefixes() {
    let dir = tiny_model(&TinyLlama::default());
    let w = loaded_worker(dir.path()).await;
    let a1 = ask(&w, &chat(&[("user", "Name three colours.")])).await;
    let b1 = ask(&w, &chat(&[("user", "Count to five, please.")])).await;
    let a_turns = [
        ("user", "Name three colours."),
        ("assistant", a1.text.as_str()),
        ("user", "And three more?"),
    ];
    let b_turns = [
        ("user", "Count to five, please."),
        ("assistant", b1.text.as_str()),
        ("user", "Now backwards."),
    ];
    let a2 = ask(&w, &chat(&a_turns)).await;
    assert!(
        a2.usage.cached_tokens >= a1.usage.prompt_tokens,
        "{:?}",
        a2.usage
    );
    let b2 = ask(&w, &chat(&b_turns)).await;
    assert!(
        b2.usage.cached_tokens >= b1.usage.prompt_tokens,
        "{:?}",
        b2.usage
    );

    let fresh = loaded_worker(dir.path()).await;
    assert_eq!(ask(&fresh, &chat(&a_turns)).await.text, a2.text);
    assert_eq!(ask(&fresh, &chat(&b_turns)).await.text, b2.text);
    fresh.shutdown().await.unwrap();
    w.shutdown().await.unwrap();

    // With no byte budget only the newest conversation is kept.
    let w = worker(&["--prompt-cache-bytes", "0"]);
    within(w.call::<Load>(&LoadParams::new(model_id(dir.path()))))
        .await
        .unwrap();
    ask(&w, &chat(&[("user", "Name three colours.")])).await;
    ask(&w, &chat(&[("user", "Count to five, please.")])).await;
    let a2 = ask(&w, &chat(&a_turns)).await;
    // Only the template's opening is shared with the newest (the other chat's) prompt.
    assert!(
        a2.usage.cached_tokens < a1.usage.prompt_tokens / 2,
        "{:?}",
        a2.usage
    );
    w.shutdown().await.unwrap();
}

/// `cache: {"persist": false}`: nothing of the request is kept (its next turn starts from
/// scratch); it may reuse what is kept, and leaves it for that conversation's next turn.
#[tokio::test]
async fn a_request_not_to_keep_is_not_kept_and_leaves_what_is() {
    let dir = tiny_model(&TinyLlama::default());
    let w = loaded_worker(dir.path()).await;
    let private = |turns: &[(&str, &str)]| GenerateParams {
        cache: Some(CacheParams {
            persist: false,
            conversation_id: None,
        }),
        ..chat(turns)
    };
    let first = ask(&w, &private(&[("user", "Name three colours.")])).await;
    let turns = [
        ("user", "Name three colours."),
        ("assistant", first.text.as_str()),
        ("user", "And three more?"),
    ];
    let next = ask(&w, &chat(&turns)).await;
    assert_eq!(
        next.usage.cached_tokens, 0,
        "nothing of the first turn was kept"
    );

    // Kept by the turn above; a request not to keep reuses it and leaves it whole.
    let peek = ask(&w, &private(&turns)).await;
    assert_eq!(peek.usage.cached_tokens, next.usage.prompt_tokens - 1);
    assert_eq!(peek.text, next.text);
    let again = ask(&w, &chat(&turns)).await;
    assert_eq!(again.usage.cached_tokens, next.usage.prompt_tokens - 1);
    w.shutdown().await.unwrap();
}
