//! The client against tiny shell scripts standing in for the worker.

use std::time::Duration;

use protocol::methods::{Status, StatusParams};
use protocol::{Client, ClientError, ErrorCode, RequestId};
use serde_json::{json, Value};

fn sh(script: &str) -> Client {
    Client::spawn("sh", ["-c", script], std::iter::empty::<(&str, &str)>()).expect("spawn sh")
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn routes_deltas_results_unmatched_responses_and_notifications() {
    // Reads one request (id 1) and answers with two deltas, a progress notification, an
    // id-null error and the result.
    let client = sh(r#"read line
printf '%s\n' \
 '{"jsonrpc":"2.0","method":"generate/delta","params":{"request_id":1,"index":0,"text":"he"}}' \
 '{"jsonrpc":"2.0","method":"load/progress","params":{"request_id":9,"stage":"ready","done":1,"total":1,"message":""}}' \
 '{"jsonrpc":"2.0","method":"generate/delta","params":{"request_id":1,"index":1,"text":"llo"}}' \
 '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}' \
 '{"jsonrpc":"2.0","id":1,"result":{"text":"hello","finish_reason":"stop","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"cached_tokens":0},"timings":{"prompt_n":1,"prompt_ms":1.0,"prompt_per_second":1.0,"predicted_n":2,"predicted_ms":2.0,"predicted_per_second":1.0,"ttft_ms":1.0}}}'
echo 'this is not json'
echo 'bye' >&2
"#);
    let handle = client
        .generate_value(json!({"messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
    assert_eq!(handle.id(), &RequestId::Number(1));
    let (deltas, result) = within(handle.collect()).await.unwrap();
    let texts: Vec<&str> = deltas.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(texts, ["he", "llo"]);
    assert_eq!(result.text, "hello");
    let n = within(client.next_notification()).await.unwrap();
    assert_eq!(n.method, "load/progress");
    let r = within(client.next_unmatched()).await.unwrap();
    assert_eq!(r.id, None);
    assert_eq!(r.outcome.unwrap_err().code, -32700);
    assert!(within(client.wait()).await.unwrap().success());
    assert!(within(client.next_unmatched()).await.is_none());
    assert_eq!(client.stray_stdout_lines(), ["this is not json"]);
    assert_eq!(client.stderr_tail(), "bye\n");
}

#[tokio::test]
async fn rpc_errors_come_back_typed() {
    let client = sh(r#"read line
echo '{"jsonrpc":"2.0","id":1,"error":{"code":-32003,"message":"busy","data":{"max_queue":16}}}'
sleep 5"#);
    let err = within(client.call::<Status>(&StatusParams {}))
        .await
        .unwrap_err();
    match err {
        ClientError::Rpc(e) => {
            assert_eq!(e.error_code(), Some(ErrorCode::Busy));
            assert_eq!(e.data, Some(json!({"max_queue": 16})));
        }
        other => panic!("{other:?}"),
    }
    client.kill();
    assert!(!within(client.wait()).await.unwrap().success());
}

#[tokio::test]
async fn a_dead_worker_fails_pending_and_later_requests_with_its_status_and_stderr() {
    let client = sh("read line; echo 'panicked at engine.rs' >&2; exit 3");
    let err = within(client.request_value("status", Value::Null))
        .await
        .unwrap_err();
    match &err {
        ClientError::WorkerExited {
            status,
            stderr_tail,
        } => {
            assert_eq!(status.and_then(|s| s.code()), Some(3));
            assert!(
                stderr_tail.contains("panicked at engine.rs"),
                "{stderr_tail}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("panicked at engine.rs"));
    let err = within(client.request_value("status", Value::Null))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::WorkerExited { .. }), "{err:?}");
    assert_eq!(within(client.wait()).await.unwrap().code(), Some(3));
}

#[tokio::test]
async fn send_raw_and_close_stdin_reach_the_worker() {
    // Echoes what it reads to stderr, then exits at end of input.
    let client = sh("cat >&2");
    client.send_raw(b"\xff raw\n".to_vec()).unwrap();
    client.notify("$/cancelRequest", json!({"id": 1})).unwrap();
    client.close_stdin();
    assert!(within(client.wait()).await.unwrap().success());
    // Give the stderr reader a moment to drain after exit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tail = client.stderr_tail();
    assert!(tail.starts_with("\u{FFFD} raw\n"), "{tail:?}");
    assert!(tail.contains(r#""method":"$/cancelRequest""#), "{tail:?}");
    assert!(matches!(
        client.send_raw("x"),
        Err(ClientError::StdinClosed)
    ));
}

#[tokio::test]
async fn spawn_failure_says_what_to_do() {
    let err = Client::spawn(
        "/nonexistent/mlx-worker",
        ["--x"],
        std::iter::empty::<(&str, &str)>(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("cargo build -p mlx-worker"),
        "{err}"
    );
}

#[tokio::test]
async fn stderr_tail_keeps_only_the_last_bytes() {
    let client = sh("i=0; while [ $i -lt 2000 ]; do echo 'line of stderr padding padding padding' >&2; i=$((i+1)); done; echo END >&2");
    within(client.wait()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tail = client.stderr_tail();
    assert!(
        tail.len() <= 64 * 1024 && tail.len() > 60 * 1024,
        "{}",
        tail.len()
    );
    assert!(tail.ends_with("END\n"));
}
