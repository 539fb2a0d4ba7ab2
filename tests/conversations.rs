//! End-to-end: conversations named by `generate`'s `cache.conversation_id`, and the calls on
//! them: `cache_list`, `cache_pin` (kept past the budget), `cache_fork` (a new conversation
//! from a kept one's prefix, answering as a fresh worker would) and `cache_evict`.

use crate::support::{self, model_id, rpc_error, tiny_model, within, worker};
use fixtures::TinyLlama;
use protocol::methods::*;
use protocol::{Client, ErrorCode};

fn turn(id: &str, turns: &[(&str, &str)]) -> GenerateParams {
    let mut p = support::chat(turns, 12);
    p.cache = Some(CacheParams {
        persist: true,
        conversation_id: Some(id.to_owned()),
    });
    p
}

async fn ask(w: &Client, p: &GenerateParams) -> GenerateResult {
    within(w.generate(p).unwrap().finish()).await.unwrap()
}

async fn list(w: &Client) -> Vec<(Option<String>, bool)> {
    let listed = within(w.call::<CacheList>(&CacheListParams::default()))
        .await
        .unwrap();
    let mut all: Vec<_> = (listed.conversations.iter())
        .map(|c| (c.conversation_id.clone(), c.pinned))
        .collect();
    all.sort();
    all
}

fn id(s: &str) -> Option<String> {
    Some(s.to_owned())
}

#[tokio::test]
async fn named_conversations_are_listed_pinned_forked_and_evicted() {
    let dir = tiny_model(&TinyLlama::default());
    // No budget: only the newest conversation stays, unless pinned.
    let w = worker(&["--prompt-cache-bytes", "0"]);
    within(w.call::<Load>(&LoadParams::new(model_id(dir.path()))))
        .await
        .unwrap();
    let a1 = ask(&w, &turn("a", &[("user", "Name three colours.")])).await;
    let pin = |conversation: &str, pinned| CachePinParams {
        model: None,
        conversation_id: conversation.to_owned(),
        pinned,
    };
    within(w.call::<CachePin>(&pin("a", true))).await.unwrap();
    ask(&w, &turn("b", &[("user", "Count to five.")])).await;
    assert_eq!(list(&w).await, [(id("a"), true), (id("b"), false)]);

    // Pinned: `a` is still there for its next turn, though the budget is 0.
    let a_turns = [
        ("user", "Name three colours."),
        ("assistant", a1.text.as_str()),
        ("user", "And three more?"),
    ];
    let a2 = ask(&w, &turn("a", &a_turns)).await;
    assert!(
        a2.usage.cached_tokens >= a1.usage.prompt_tokens,
        "{:?}",
        a2.usage
    );
    // Its entry was replaced by the longer one, still pinned; `b` left.
    assert_eq!(list(&w).await, [(id("a"), true)]);

    // A fork at the first turn's prompt: shares it, and answers the other question as a fresh
    // worker does, leaving `a` whole.
    let fork = CacheForkParams {
        model: None,
        conversation_id: "a".into(),
        new_conversation_id: "a-fork".into(),
        tokens: Some(a1.usage.prompt_tokens),
    };
    let forked = within(w.call::<CacheFork>(&fork)).await.unwrap();
    assert_eq!(forked.tokens, a1.usage.prompt_tokens);
    within(w.call::<CachePin>(&pin("a-fork", true)))
        .await
        .unwrap();
    let other = [
        ("user", "Name three colours."),
        ("assistant", a1.text.as_str()),
        ("user", "Which is warmest?"),
    ];
    let f2 = ask(&w, &turn("a-fork", &other)).await;
    assert!(
        f2.usage.cached_tokens >= a1.usage.prompt_tokens,
        "{:?}",
        f2.usage
    );
    let e = rpc_error(
        within(w.call::<CacheFork>(&fork)).await,
        ErrorCode::InvalidParams,
    );
    assert!(e.message.contains("exists already"), "{}", e.message);
    let fresh = worker(&[]);
    within(fresh.call::<Load>(&LoadParams::new(model_id(dir.path()))))
        .await
        .unwrap();
    let mut cold = turn("x", &other);
    cold.cache = None;
    assert_eq!(ask(&fresh, &cold).await.text, f2.text);
    fresh.shutdown().await.unwrap();
    let a3 = ask(&w, &turn("a", &a_turns)).await;
    assert_eq!(a3.usage.cached_tokens, a2.usage.prompt_tokens - 1);
    assert_eq!(a3.text, a2.text);
    // Both pinned (the fork's pin went on to its longer entry).
    assert_eq!(list(&w).await, [(id("a"), true), (id("a-fork"), true)]);

    // Errors say what is wrong; nothing changes.
    let e = rpc_error(
        within(w.call::<CachePin>(&pin("nobody", true))).await,
        ErrorCode::InvalidParams,
    );
    assert!(e.message.contains("cache_list"), "{}", e.message);

    // Evicting one, then every one.
    let evict = |conversation: Option<&str>| CacheEvictParams {
        model: None,
        conversation_id: conversation.map(str::to_owned),
    };
    let gone = within(w.call::<CacheEvict>(&evict(Some("a"))))
        .await
        .unwrap();
    assert_eq!(gone.evicted, 1);
    assert_eq!(list(&w).await, [(id("a-fork"), true)]);
    within(w.call::<CacheEvict>(&evict(None))).await.unwrap();
    assert_eq!(list(&w).await, []);
    let after = ask(&w, &turn("a", &a_turns)).await;
    assert_eq!(after.usage.cached_tokens, 0);

    // `status` counts lookups and hits per tier.
    let cache = support::settled_status(&w).await.prompt_cache;
    assert_eq!(cache.lookups, 6);
    // Every one but the first and the last (`b` shares the template's opening with `a`).
    assert_eq!(cache.memory.hits, 4, "{cache:?}");
    assert!((cache.memory.hit_rate - 4.0 / 6.0).abs() < 1e-9);
    assert!(cache.disk.is_none());
    w.shutdown().await.unwrap();
}
