//! End-to-end: queueing, cancellation and lifecycle while the real engine works, on a tiny
//! random Llama whose generations run to `max_new_tokens` (thousands of tokens take seconds).

use std::time::{Duration, Instant};

use crate::support::{greedy, model_id, rpc_error, within, within_for, worker_with_tiny_model};
use fixtures::FIRST_BYTE_ID;
use protocol::error::BusyData;
use protocol::methods::*;
use protocol::ErrorCode;
use serde_json::json;

/// Long enough to outlast everything a test does while it runs (seconds on 2 CPU cores).
const LONG: u32 = 3000;

fn gen(max_new_tokens: u32) -> GenerateParams {
    greedy("hi", max_new_tokens)
}

#[tokio::test]
async fn status_tokenize_and_cancel_are_answered_during_a_generation() {
    let (w, _dir) = worker_with_tiny_model(&[]).await;
    let mut g = w.generate(&gen(LONG)).unwrap();
    let mut streamed = within(g.next_delta()).await.unwrap().text;
    let t = Instant::now();
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "status took {:?}",
        t.elapsed()
    );
    assert_eq!(status.state, WorkerState::Generating);
    assert_eq!(
        status.queue,
        QueueInfo {
            running: 1,
            waiting: 0
        }
    );
    let t = Instant::now();
    let tokens = within(w.call::<Tokenize>(&TokenizeParams::text("ab")))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "tokenize took {:?}",
        t.elapsed()
    );
    assert_eq!(tokens.tokens, [FIRST_BYTE_ID + 97, FIRST_BYTE_ID + 98]);
    assert!(within(w.cancel(g.id())).await.unwrap().cancelled);
    while let Some(delta) = within(g.next_delta()).await {
        streamed.push_str(&delta.text);
    }
    let result = within(g.finish()).await.unwrap();
    assert_eq!(result.finish_reason, FinishReason::Cancelled);
    // The text so far: all that was streamed, short of the limit.
    assert_eq!(result.text, streamed);
    assert!(
        (1..u64::from(LONG)).contains(&result.usage.completion_tokens),
        "{:?}",
        result.usage
    );
    // Cancelling what is gone is not an error.
    assert!(!within(w.cancel(&12345.into())).await.unwrap().cancelled);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_busy_and_queued_requests_can_be_cancelled() {
    let (w, _dir) = worker_with_tiny_model(&["--max-queue", "2"]).await;
    let mut running = w.generate(&gen(LONG)).unwrap();
    within(running.next_delta()).await.unwrap();
    let queued_gen = w.generate(&gen(3)).unwrap();
    let reset_id = w.next_id();
    w.send_raw(format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"reset\"}}\n",
        match &reset_id {
            protocol::RequestId::Number(n) => n.to_string(),
            _ => unreachable!(),
        }
    ))
    .unwrap();
    // The queue holds 2: the third waiting request is refused.
    let e = rpc_error(
        within(w.generate(&gen(3)).unwrap().finish()).await,
        ErrorCode::Busy,
    );
    assert_eq!(e.data_as::<BusyData>().unwrap().max_queue, 2);
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(
        status.queue,
        QueueInfo {
            running: 1,
            waiting: 2
        }
    );
    // A queued generate answers `cancelled`; a queued reset answers -32800.
    assert!(within(w.cancel(queued_gen.id())).await.unwrap().cancelled);
    let r = within(queued_gen.finish()).await.unwrap();
    assert_eq!(
        (r.finish_reason, r.text.as_str()),
        (FinishReason::Cancelled, "")
    );
    w.notify("notifications/cancelled", json!({"requestId": reset_id}))
        .unwrap();
    let r = within(w.next_unmatched()).await.unwrap();
    assert_eq!(r.id, Some(reset_id));
    assert_eq!(
        r.outcome.unwrap_err().code,
        ErrorCode::RequestCancelled.code()
    );
    // The LSP-style notification cancels the running one.
    w.notify("$/cancelRequest", json!({"id": running.id()}))
        .unwrap();
    assert_eq!(
        within(running.finish()).await.unwrap().finish_reason,
        FinishReason::Cancelled
    );
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn requests_run_in_arrival_order() {
    let (w, dir) = worker_with_tiny_model(&[]).await;
    let a = w.generate(&gen(3)).unwrap();
    let unload_params = UnloadParams::default();
    let unload = w.call::<Unload>(&unload_params);
    let (ra, ru) = within(async { tokio::join!(a.finish(), unload) }).await;
    assert_eq!(ra.unwrap().finish_reason, FinishReason::Length);
    assert_eq!(ru.unwrap().unloaded, [model_id(dir.path())]);
    rpc_error(
        within(w.generate(&gen(3)).unwrap().finish()).await,
        ErrorCode::NoModel,
    );
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn sigterm_and_sigint_mid_generation_cancel_and_exit_zero_within_a_second() {
    for sig in ["-TERM", "-INT"] {
        let (w, _dir) = worker_with_tiny_model(&[]).await;
        let mut g = w.generate(&gen(LONG)).unwrap();
        let queued = w.generate(&gen(LONG)).unwrap();
        within(g.next_delta()).await.unwrap();
        let t = Instant::now();
        let pid = w.pid().unwrap().to_string();
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert_eq!(within(w.wait()).await.unwrap().code(), Some(0), "{sig}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{sig}: {:?}",
            t.elapsed()
        );
        // Both still answered, cancelled.
        for g in [g, queued] {
            let result = within(g.finish()).await.unwrap();
            assert_eq!(result.finish_reason, FinishReason::Cancelled, "{sig}");
        }
    }
}

#[tokio::test]
async fn shutdown_and_end_of_stdin_finish_the_work_received_first() {
    for how in ["shutdown", "eof"] {
        let (w, _dir) = worker_with_tiny_model(&[]).await;
        let mut running = w.generate(&gen(200)).unwrap();
        let queued = w.generate(&gen(40)).unwrap();
        within(running.next_delta()).await.unwrap();
        // Sent at once (a client call would only go out when awaited); answered last.
        let shutdown = how == "shutdown";
        if shutdown {
            w.send_raw("{\"jsonrpc\":\"2.0\",\"id\":\"bye\",\"method\":\"shutdown\"}\n")
                .unwrap();
        } else {
            w.close_stdin();
        }
        if shutdown {
            // While it drains, `status` is still answered and new work is refused.
            let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
            assert_eq!(status.state, WorkerState::Generating);
            let refused = rpc_error(
                within(w.call::<Generate>(&gen(4))).await,
                ErrorCode::InvalidRequest,
            );
            assert!(
                refused.message.contains("shutting down"),
                "{}",
                refused.message
            );
        }
        let first = within_for(Duration::from_secs(60), running.finish())
            .await
            .unwrap();
        let second = within_for(Duration::from_secs(60), queued.finish())
            .await
            .unwrap();
        assert_eq!(first.finish_reason, FinishReason::Length, "{how}");
        assert_eq!(first.usage.completion_tokens, 200, "{how}");
        assert_eq!(second.finish_reason, FinishReason::Length, "{how}");
        assert_eq!(second.usage.completion_tokens, 40, "{how}");
        if shutdown {
            let answer = within(w.next_unmatched()).await.unwrap();
            assert_eq!(answer.id, Some("bye".into()));
            assert_eq!(answer.outcome.unwrap(), json!({}));
        }
        assert_eq!(within(w.wait()).await.unwrap().code(), Some(0), "{how}");
    }
}

/// A `load` of `model` and a long greedy `generate`, as lines for a worker's stdin.
fn load_and_generate_lines(model: &str) -> String {
    let load = json!({"jsonrpc": "2.0", "id": 1, "method": "load", "params": {"model": model}});
    let generate = json!({"jsonrpc": "2.0", "id": 2, "method": "generate",
        "params": {"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": LONG,
                   "temperature": 0}});
    format!("{load}\n{generate}\n")
}

/// Reads `stdout` until a `generate/delta` shows that the generation runs.
fn read_until_a_delta(stdout: &mut impl std::io::BufRead) {
    let mut line = String::new();
    while !line.contains("generate/delta") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "stdout ended early"
        );
    }
}

/// Waits up to `limit` for `pid` to end (a zombie, never reaped in some containers, counts).
fn ended_within(pid: u32, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn a_closed_stdout_cancels_and_exits_within_a_second() {
    use std::io::Write;
    let dir = crate::support::tiny_model(&fixtures::TinyLlama::default());
    let mut child = crate::support::raw_worker();
    let lines = load_and_generate_lines(&model_id(dir.path()));
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(lines.as_bytes()).unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    read_until_a_delta(&mut stdout);
    let t = Instant::now();
    drop(stdout);
    assert!(
        ended_within(child.id(), Duration::from_secs(1)),
        "still running {:?} after stdout closed",
        t.elapsed()
    );
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_dead_parent_cancels_and_exits_within_a_second() {
    use std::io::{BufRead, Write};
    let dir = crate::support::tiny_model(&fixtures::TinyLlama::default());
    // A shell is the worker's parent; the test keeps the pipes open and kills the shell.
    let mut shell = std::process::Command::new("sh")
        // Without job control, sh gives a background job /dev/null as its stdin, before any
        // redirection of fd 0: the pipe goes through fd 3.
        .args([
            "-c",
            "exec 3<&0; \"$0\" <&3 3<&- & echo $!; wait",
            env!("CARGO_BIN_EXE_mlx-worker"),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(shell.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let worker: u32 = line.trim().parse().unwrap();
    let lines = load_and_generate_lines(&model_id(dir.path()));
    let stdin = shell.stdin.as_mut().unwrap();
    stdin.write_all(lines.as_bytes()).unwrap();
    read_until_a_delta(&mut stdout);
    let t = Instant::now();
    shell.kill().unwrap();
    shell.wait().unwrap();
    assert!(
        ended_within(worker, Duration::from_secs(1)),
        "the worker still runs {:?} after its parent died",
        t.elapsed()
    );
}

#[test]
fn a_host_that_stops_reading_pauses_the_generation_instead_of_queueing_without_bound() {
    use std::io::Write;
    let dir = crate::support::tiny_model(&fixtures::TinyLlama::default());
    let mut child = crate::support::raw_worker();
    let stdin = child.stdin.as_mut().unwrap();
    stdin
        .write_all(load_and_generate_lines(&model_id(dir.path())).as_bytes())
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    read_until_a_delta(&mut stdout);
    // The host stops reading for two seconds, then asks for `status` and reads on: the
    // generation waited (at most the pipe and 256 messages were queued; the waiting itself is
    // unit-tested in transport.rs) and goes on to the end with nothing lost.
    std::thread::sleep(Duration::from_secs(2));
    let status = json!({"jsonrpc": "2.0", "id": 3, "method": "status"});
    stdin.write_all(format!("{status}\n").as_bytes()).unwrap();
    let (before, status) = read_answer(&mut stdout, 3);
    // What waited for stdout: the pipe (64 KiB) and at most 256 queued messages.
    assert!(
        before < 1500,
        "{before} deltas were queued while nobody read"
    );
    assert_eq!(
        status["result"]["state"], "generating",
        "the generation paused: {status}"
    );
    // Read again, it goes on to the end, nothing lost.
    let (after, message) = read_answer(&mut stdout, 2);
    let result = &message["result"];
    assert_eq!(result["finish_reason"], "length", "{message}");
    assert_eq!(result["usage"]["completion_tokens"], LONG);
    let deltas = before + after;
    assert!(deltas > 0);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// Reads `stdout` up to the response with id `id`: the number of deltas before it, and it.
fn read_answer(stdout: &mut impl std::io::BufRead, id: i64) -> (usize, serde_json::Value) {
    let mut deltas = 0;
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "stdout ended early"
        );
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        match (message["method"].as_str(), message["id"].as_i64()) {
            (Some("generate/delta"), _) => deltas += 1,
            (_, Some(answered)) if answered == id => return (deltas, message),
            _ => {}
        }
    }
}
