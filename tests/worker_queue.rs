//! End-to-end: queueing, cancellation and lifecycle during work, against the worker built with
//! its scripted backend (`cargo test -p mlx-worker --features fake-engine`).

#[path = "common_worker.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{within, worker};
use protocol::error::BusyData;
use protocol::methods::*;
use protocol::{ClientError, ErrorCode, LoadErrorKind};
use serde_json::json;

fn gen(max_new_tokens: u32) -> GenerateParams {
    let mut p = GenerateParams::new(vec![ChatMessage::new("user", "hi")]);
    p.max_new_tokens = max_new_tokens;
    p
}

async fn loaded(args: &[&str]) -> protocol::Client {
    let w = worker(args);
    let r = within(w.call::<Load>(&LoadParams::new("fake/tiny")))
        .await
        .unwrap();
    assert_eq!(r.model_id, "fake/tiny");
    w
}

#[tokio::test]
async fn load_reports_progress_and_generate_streams_deltas_then_the_result() {
    let w = loaded(&[]).await;
    let progress = within(w.next_notification()).await.unwrap();
    assert_eq!(progress.method, "load/progress");
    let (deltas, result) = within(w.generate(&gen(5)).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(
        deltas.iter().map(|d| d.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        result.text
    );
    assert_eq!(result.finish_reason, FinishReason::Length);
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.active_model.as_deref(), Some("fake/tiny"));
    assert_eq!(status.models.len(), 1);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn status_tokenize_and_cancel_are_answered_during_a_generation() {
    let w = loaded(&[]).await;
    let mut g = w.generate(&gen(10_000)).unwrap();
    within(g.next_delta()).await.unwrap();
    let t = Instant::now();
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.state, WorkerState::Generating);
    assert_eq!(
        status.queue,
        QueueInfo {
            running: 1,
            waiting: 0
        }
    );
    let tokens = within(w.call::<Tokenize>(&TokenizeParams::text("ab")))
        .await
        .unwrap();
    assert_eq!(tokens.tokens, [97, 98]);
    assert!(within(w.cancel(g.id())).await.unwrap().cancelled);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    let result = within(g.finish()).await.unwrap();
    assert_eq!(result.finish_reason, FinishReason::Cancelled);
    assert!(result.text.starts_with("t0 "));
    // Cancelling what is gone is not an error.
    assert!(!within(w.cancel(&12345.into())).await.unwrap().cancelled);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_busy_and_queued_requests_can_be_cancelled() {
    let w = loaded(&["--max-queue", "2"]).await;
    let mut running = w.generate(&gen(10_000)).unwrap();
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
    let err = within(w.generate(&gen(3)).unwrap().finish())
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.error_code(), Some(ErrorCode::Busy));
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
    let w = loaded(&[]).await;
    let a = w.generate(&gen(3)).unwrap();
    let unload_params = UnloadParams::default();
    let unload = w.call::<Unload>(&unload_params);
    let (ra, ru) = within(async { tokio::join!(a.finish(), unload) }).await;
    assert_eq!(ra.unwrap().finish_reason, FinishReason::Length);
    assert_eq!(ru.unwrap().unloaded, ["fake/tiny"]);
    let err = within(w.generate(&gen(3)).unwrap().finish())
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.error_code(), Some(ErrorCode::NoModel));
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_failed_load_says_why() {
    let w = worker(&[]);
    let err = within(w.call::<Load>(&LoadParams::new("missing/model")))
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = err else {
        panic!("{err:?}")
    };
    let data: protocol::error::LoadFailedData = e.data_as().unwrap();
    assert_eq!(data.kind, LoadErrorKind::NotFound);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn end_of_stdin_sigterm_and_shutdown_mid_generation_exit_zero_within_a_second() {
    for how in ["eof", "sigterm", "shutdown"] {
        let w = loaded(&[]).await;
        let mut g = w.generate(&gen(100_000)).unwrap();
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
