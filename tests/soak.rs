//! Soak: many generations with mixed parameters, stop strings, cancels, LoRA switches, loads and
//! unloads, through the real binary; afterwards MLX's active memory, the resident set, open file
//! descriptors and threads are where they were after warm-up, and the checked model still gives
//! the same greedy text.
//!
//! `SOAK_GENERATIONS` (default 120) sets the length; `cargo xtask soak` runs 1000 in release and
//! prints the drifts (recorded in docs/reliability.md).

use std::time::Duration;

use fixtures::{write_tiny_lora, AdapterLayout, TinyLlama};
use protocol::methods::*;
use protocol::Client;

use crate::support::{greedy, model_id, tiny_model, within, within_for, worker};

/// SplitMix64: the soak's choices, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

/// What is measured before and after.
#[derive(Debug, Clone)]
struct Reading {
    active_bytes: u64,
    rss_bytes: u64,
    fds: u64,
    threads: u64,
    /// Thread names (Linux), for the message when the count moves.
    names: Vec<String>,
}

async fn read(w: &Client) -> Reading {
    // The prompt cache keeps a varying number of recent conversations (within its byte budget):
    // emptied, what stays is the weights and anything leaked.
    within(w.call::<Reset>(&ResetParams::default()))
        .await
        .unwrap();
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    let pid = w.pid().expect("the worker runs");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    Reading {
        names,
        active_bytes: status.memory.active_bytes,
        rss_bytes: field("VmRSS:") * 1024,
        fds,
        threads: field("Threads:"),
    }
}

/// One request of the storm: mixed sampling, stop strings, logprobs, the adapter on or off;
/// sometimes cancelled after its first delta.
async fn one_generation(w: &Client, rng: &mut Rng, model: &str) {
    let prompts = ["hi", "Tell me a story.", "List three colours.", "Why?"];
    let mut p = greedy(prompts[rng.below(4) as usize], 1 + rng.below(32) as u32);
    p.model = Some(model.to_owned());
    if rng.chance(0.5) {
        p.sampling.temperature = 0.7;
        p.sampling.top_p = 0.9;
        p.sampling.top_k = 1 + rng.below(50) as i32;
        p.sampling.min_p = 0.05;
        p.sampling.seed = Some(rng.next());
    }
    if rng.chance(0.3) {
        p.sampling.repetition_penalty = 1.1;
        p.sampling.presence_penalty = 0.2;
        p.sampling.frequency_penalty = 0.2;
    }
    if rng.chance(0.3) {
        p.stop = vec!["e".into(), "\n\n".into()];
    }
    if rng.chance(0.2) {
        p.logprobs = 3;
    }
    p.use_adapter = [None, Some(true), Some(false)][rng.below(3) as usize];
    let mut handle = w.generate(&p).unwrap();
    if rng.chance(0.15) {
        let id = handle.id().clone();
        let _ = within(handle.next_delta()).await;
        within(w.cancel(&id)).await.unwrap();
    }
    within_for(Duration::from_secs(60), handle.finish())
        .await
        .expect("generate (or its cancellation) answers");
}

#[tokio::test]
async fn a_long_mixed_session_leaks_nothing() {
    let generations: u64 = std::env::var("SOAK_GENERATIONS").map_or(120, |v| v.parse().unwrap());
    let mut rng = Rng(0x50a1);
    let base = tiny_model(&TinyLlama::default());
    let other = tiny_model(&TinyLlama {
        seed: 3,
        ..Default::default()
    });
    let (base_id, other_id) = (model_id(base.path()), model_id(other.path()));
    let adapter = tempfile::tempdir().unwrap();
    write_tiny_lora(adapter.path(), 5, AdapterLayout::MlxLm, &base_id).unwrap();
    let mut with_adapter = LoadParams::new(&base_id);
    with_adapter.adapter = Some(model_id(adapter.path()));

    let w = worker(&[]);
    within(w.call::<Load>(&with_adapter)).await.unwrap();
    let mut check = greedy("The soak's reference prompt", 24);
    check.model = Some(base_id.clone());
    let reference = within(w.generate(&check).unwrap().finish())
        .await
        .unwrap()
        .text;

    // Warm-up: every path once (allocator pools, caches, threads started lazily).
    for _ in 0..generations / 10 + 20 {
        one_generation(&w, &mut rng, &base_id).await;
    }
    within(w.call::<Load>(&LoadParams::new(&other_id)))
        .await
        .unwrap();
    within(w.call::<Unload>(&UnloadParams {
        model: Some(other_id.clone()),
    }))
    .await
    .unwrap();
    let before = read(&w).await;

    for i in 0..generations {
        one_generation(&w, &mut rng, &base_id).await;
        if i % 50 == 25 {
            // A second model comes and goes; the adapter is reloaded.
            within(w.call::<Load>(&LoadParams::new(&other_id)))
                .await
                .unwrap();
            one_generation(&w, &mut rng, &other_id).await;
            within(w.call::<Unload>(&UnloadParams {
                model: Some(other_id.clone()),
            }))
            .await
            .unwrap();
            within(w.call::<Load>(&with_adapter)).await.unwrap();
        }
    }
    let after = read(&w).await;
    let again = within(w.generate(&check).unwrap().finish())
        .await
        .unwrap()
        .text;
    within(w.shutdown()).await.unwrap();

    let drift = |a: u64, b: u64| b as i64 - a as i64;
    eprintln!(
        "soak: {generations} generations; drift: MLX active {} B, RSS {} KiB, fds {}, threads {} \
         (after warm-up: active {} B, RSS {} KiB, {} fds, {} threads)",
        drift(before.active_bytes, after.active_bytes),
        drift(before.rss_bytes, after.rss_bytes) / 1024,
        drift(before.fds, after.fds),
        drift(before.threads, after.threads),
        before.active_bytes,
        before.rss_bytes / 1024,
        before.fds,
        before.threads,
    );
    assert_eq!(again, reference, "the checked model still answers the same");
    assert_eq!(after.active_bytes, before.active_bytes, "MLX active memory");
    if cfg!(target_os = "linux") {
        assert_eq!(after.fds, before.fds, "open file descriptors");
        // Tokio's blocking pool (stdin, stdout, tokenize) grows and shrinks within its bound
        // (2 runtime workers + 8 in the pool; its idle threads exit after 10 s); every other
        // thread is the same before and after.
        let others = |r: &Reading| -> Vec<String> {
            r.names
                .iter()
                .filter(|n| *n != "tokio-rt-worker")
                .cloned()
                .collect()
        };
        let pool = after.names.len() - others(&after).len();
        assert_eq!(
            others(&after),
            others(&before),
            "threads other than tokio's"
        );
        assert!(pool <= 2 + 8, "tokio threads: {:?}", after.names);
        // The allocator keeps some freed memory for reuse: bounded, not zero.
        assert!(
            drift(before.rss_bytes, after.rss_bytes) < 16 << 20 && after.rss_bytes > 0,
            "resident set grew from {} to {} bytes",
            before.rss_bytes,
            after.rss_bytes
        );
    }
}
