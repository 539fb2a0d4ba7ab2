//! Structure-aware fuzzing of the dispatcher, end to end: the real `mlx-worker` binary over real
//! pipes, the real engine with a tiny model resident, and a seeded generator of lines that are
//! mostly *almost* valid requests (real method names, ids of every JSON type, params with the
//! right fields and wrong types or values, odd messages, cancels of random ids) mixed with
//! notifications, responses, garbage, batches, over-long lines and invalid UTF-8.
//!
//! An oracle written from the contract (not from the codec) says what each line must get: one
//! response with its id, one id-null error (-32700 / -32600), or nothing. The test checks that
//! every expectation is met exactly once, that every response is a JSON-RPC 2.0 response whose
//! error code is in the contract (and plausible for its method), whose result has its method's
//! shape, that deltas add up to the text, that stdout carries nothing else, and that afterwards
//! the worker still answers `status`, the resident model still generates the same greedy text,
//! and `shutdown` exits 0.
//!
//! `FUZZ_SEED` (decimal or 0x-hex) and `FUZZ_ITERS` (lines, default 1500) override the run;
//! the seed is printed at the start and in every failure.

mod generator;
mod oracle;
mod runner;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::{greedy, model_id, tiny_model, within, within_for, worker};
use fixtures::TinyLlama;
use protocol::methods::{
    Cancel, Generate, GenerateDelta, GenerateResult, Initialize, Load, Method, Reset, Status,
    StatusParams, Tokenize, Unload, WorkerState,
};
use protocol::{Client, ErrorCode, RequestId, Response, ResponseError};
use serde_json::{json, Map, Value};

use generator::*;
use oracle::*;
use runner::*;

const DEFAULT_SEED: u64 = 0x5eed_f022;
const DEFAULT_ITERS: usize = 1500;
/// The worker's line limit in this test, small so that over-long lines are cheap to send.
const MAX_LINE_BYTES: usize = 16 * 1024;
/// How long one barrier may wait for every answer (a queue full of short generations).
const BARRIER_LIMIT: Duration = Duration::from_secs(90);

fn tail(s: &str, n: usize) -> &str {
    let mut at = s.len().saturating_sub(n);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_survives_a_storm_of_almost_valid_lines() {
    let seed = env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let iters = env_u64("FUZZ_ITERS").map_or(DEFAULT_ITERS, |n| n as usize);
    eprintln!("worker fuzz: FUZZ_SEED={seed:#x} FUZZ_ITERS={iters}");
    let started = Instant::now();

    let tiny_dir = tiny_model(&TinyLlama::default());
    let other_dir = tiny_model(&TinyLlama {
        seed: 7,
        max_position_embeddings: 64,
        ..Default::default()
    });
    let unsupported = tiny_model(&TinyLlama {
        model_type: "rwkv7".into(),
        ..Default::default()
    });
    let broken = tiny_model(&TinyLlama::default());
    std::fs::write(
        broken.path().join("config.json"),
        b"{\"model_type\": \"llama\", ",
    )
    .unwrap();
    let truncated = tiny_model(&TinyLlama::default());
    for entry in std::fs::read_dir(truncated.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
        }
    }
    let no_tokenizer = tiny_model(&TinyLlama::default());
    std::fs::remove_file(no_tokenizer.path().join("tokenizer.json")).unwrap();
    let tiny = model_id(tiny_dir.path());

    let client = worker(&[
        "--max-line-bytes",
        &MAX_LINE_BYTES.to_string(),
        "--max-queue",
        "6",
    ]);
    within(client.call::<Load>(&protocol::methods::LoadParams::new(tiny.clone())))
        .await
        .expect("load the tiny model");
    let mut reference = greedy("The fuzz reference prompt", 24);
    reference.model = Some(tiny.clone());
    let before = within(client.generate(&reference).unwrap().finish())
        .await
        .expect("generate before the storm");
    assert_eq!(before.usage.completion_tokens, 24);
    // The notifications of the calls above are not part of the storm.
    while let Ok(Some(_)) =
        tokio::time::timeout(Duration::from_millis(50), client.next_notification()).await
    {}

    let mut gen = Generator {
        rng: Rng(seed),
        tiny: tiny.clone(),
        other: model_id(other_dir.path()),
        bad_models: vec![
            "/nonexistent/model".into(),
            "/nonexistent/model.gguf".into(),
            model_id(unsupported.path()),
            model_id(broken.path()),
            model_id(truncated.path()),
            model_id(no_tokenizer.path()),
            tiny_dir.path().join("config.json").display().to_string(),
            "/".into(),
            "../../etc".into(),
            "org/name".into(),
            "\u{0}".into(),
        ],
        recent_ids: Vec::new(),
        counter: 0,
        clean: false,
    };
    let mut run = Run {
        seed,
        client,
        pending: HashMap::new(),
        answered: HashMap::new(),
        null_errors: Vec::new(),
        sent: HashMap::new(),
        load_ids: HashSet::new(),
        generate_ids: HashSet::new(),
        deltas: HashMap::new(),
        recent_lines: Vec::new(),
        chunk: 0,
        requests: 0,
        responses: 0,
        generations_checked: 0,
        errors_by_code: HashMap::new(),
        outcomes: HashMap::new(),
    };

    let mut lines_sent = 0;
    while lines_sent < iters {
        run.chunk += 1;
        let keep = run.recent_lines.len().saturating_sub(40);
        run.recent_lines.drain(..keep);
        let n = (1 + gen.rng.below(24)).min(iters - lines_sent);
        let mut bytes = Vec::new();
        for _ in 0..n {
            bytes.extend(gen.lines());
        }
        // The oracle sees the lines as the worker's framer will: split at `\n`.
        let mut parts: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        parts.pop(); // after the last `\n`
        for line in parts {
            run.expect_line(line);
        }
        lines_sent += n;
        // Sent in pieces of random sizes (a line may arrive in several reads).
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let cut = if gen.rng.chance(0.3) {
                1 + gen.rng.below(rest.len())
            } else {
                rest.len()
            };
            if let Err(e) = run.client.send_raw(&rest[..cut]) {
                run.fail(format!("sending failed: {e}"));
            }
            rest = &rest[cut..];
        }
        // Mostly wait for every answer; sometimes let work pile up (busy, cancel of queued work).
        if gen.rng.chance(0.7) || lines_sent >= iters {
            run.barrier().await;
        }
    }

    // After the storm: nothing more arrives, status answers, the checked model is unchanged.
    run.recent_lines.clear();
    if let Ok(Some(r)) =
        tokio::time::timeout(Duration::from_millis(300), run.client.next_unmatched()).await
    {
        run.fail(format!("an extra response after every answer came: {r:?}"));
    }
    let status = within(run.client.call::<Status>(&StatusParams {}))
        .await
        .unwrap_or_else(|e| run.fail(format!("status after the storm: {e}")));
    assert_eq!(status.state, WorkerState::Idle, "FUZZ_SEED={seed:#x}");
    assert_eq!(
        (status.queue.running, status.queue.waiting),
        (0, 0),
        "FUZZ_SEED={seed:#x}"
    );
    assert!(
        status.models.iter().any(|m| m.model_id == tiny),
        "FUZZ_SEED={seed:#x}: the checked model is gone: {:?}",
        status.models
    );
    let after = within_for(
        Duration::from_secs(30),
        run.client.generate(&reference).unwrap().finish(),
    )
    .await
    .unwrap_or_else(|e| run.fail(format!("generate after the storm: {e}")));
    assert_eq!(
        (after.text.as_str(), after.finish_reason),
        (before.text.as_str(), before.finish_reason),
        "FUZZ_SEED={seed:#x}: greedy text changed"
    );
    let exit = within(run.client.shutdown())
        .await
        .unwrap_or_else(|e| run.fail(format!("shutdown: {e}")));
    assert_eq!(exit.code(), Some(0), "FUZZ_SEED={seed:#x}");
    let stray = run.client.stray_stdout_lines();
    assert!(
        stray.is_empty(),
        "FUZZ_SEED={seed:#x}: stray stdout: {stray:?}"
    );

    let mut codes: Vec<_> = run.errors_by_code.iter().collect();
    codes.sort();
    eprintln!(
        "worker fuzz: FUZZ_SEED={seed:#x}: {lines_sent} generated lines, {} requests with ids, {} responses ({} id-null), {} generations checked against their deltas, errors by code {codes:?}, {:.1} s",
        run.requests,
        run.responses,
        run.responses - run.requests,
        run.generations_checked,
        started.elapsed().as_secs_f64()
    );
    if std::env::var_os("FUZZ_VERBOSE").is_some() {
        let mut outcomes: Vec<_> = run.outcomes.iter().collect();
        outcomes.sort();
        eprintln!("worker fuzz: answers by (method, code; 0 = result): {outcomes:?}");
    }
    // The storm must have reached the engine, not only the parser.
    assert!(
        run.generations_checked > 0 || iters < 200,
        "no generation ran"
    );
}
