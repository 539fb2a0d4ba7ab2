//! End-to-end: queueing, cancellation and lifecycle while the real engine works, on a tiny
//! random Llama whose generations run to `max_new_tokens` (thousands of tokens take seconds).

use std::time::{Duration, Instant};

use crate::support::{greedy, model_id, rpc_error, within, worker_with_tiny_model};
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
async fn end_of_stdin_sigterm_and_shutdown_mid_generation_exit_zero_within_a_second() {
    for how in ["eof", "sigterm", "shutdown"] {
        let (w, _dir) = worker_with_tiny_model(&[]).await;
        let mut g = w.generate(&gen(LONG)).unwrap();
        within(g.next_delta()).await.unwrap();
        let t = Instant::now();
        match how {
            "eof" => w.close_stdin(),
            "sigterm" => {
                let pid = w.pid().unwrap().to_string();
                std::process::Command::new("kill")
                    .args(["-TERM", &pid])
                    .status()
                    .unwrap();
            }
            _ => {
                within(w.call::<Shutdown>(&ShutdownParams {}))
                    .await
                    .unwrap();
            }
        }
        assert_eq!(within(w.wait()).await.unwrap().code(), Some(0), "{how}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{how}: {:?}",
            t.elapsed()
        );
        // The running generation still answered, cancelled.
        assert_eq!(
            within(g.finish()).await.unwrap().finish_reason,
            FinishReason::Cancelled,
            "{how}"
        );
    }
}
