//! End-to-end: the real `mlx-worker` binary against bad input and its lifecycle, with no model
//! loaded.

use std::time::{Duration, Instant};

use crate::support::{within, worker};
use protocol::error::{BusyData, InvalidParamsData};
use protocol::methods::{Initialize, InitializeParams, Status, StatusParams, WorkerState};
use protocol::{ClientError, ErrorCode, RequestId, Response};
use serde_json::{json, Value};

fn code(r: &Response) -> i64 {
    r.outcome.as_ref().expect_err("an error response").code
}

#[tokio::test]
async fn every_kind_of_bad_input_gets_its_error_and_the_worker_keeps_serving() {
    let w = worker(&["--max-line-bytes", "200"]);
    let cases: [(&[u8], Option<RequestId>, i64); 9] = [
        (b"{not json\n", None, -32700),
        (b"\xff\xfe\n", None, -32700),
        (b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\"}]\n", None, -32600),
        (b"42\n", None, -32600),
        (b"{\"jsonrpc\":\"2.0\",\"id\":11}\n", Some(11.into()), -32600),
        (b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"nope\"}\n", Some(12.into()), -32601),
        (b"{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"generate\",\"params\":{\"messages\":[],\"temperature\":\"x\"}}\n", Some(13.into()), -32602),
        (b"{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"cancel\",\"params\":{}}\n", Some("s".into()), -32602),
        (b"{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"status\",\"params\":7}\n", Some(14.into()), -32600),
    ];
    for (line, id, expected) in cases {
        w.send_raw(line).unwrap();
        let r = within(w.next_unmatched()).await.unwrap();
        assert_eq!(
            (r.id.clone(), code(&r)),
            (id, expected),
            "{}",
            String::from_utf8_lossy(line)
        );
    }
    // -32602 names the field.
    w.send_raw(
        &b"{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"load\",\"params\":{\"model\":3}}\n"[..],
    )
    .unwrap();
    let r = within(w.next_unmatched()).await.unwrap();
    let data: InvalidParamsData = r.outcome.unwrap_err().data_as().unwrap();
    assert_eq!(data.field, "model");
    // Studio's audio commands: method not found, with a message that says why.
    w.send_raw(&b"{\"jsonrpc\":\"2.0\",\"id\":18,\"method\":\"generate_audio\"}\n"[..])
        .unwrap();
    let e = within(w.next_unmatched())
        .await
        .unwrap()
        .outcome
        .unwrap_err();
    assert_eq!(e.code, -32601);
    assert!(
        e.message.contains("audio is not supported"),
        "{}",
        e.message
    );
    // An over-long line is discarded with -32600 and the id its first bytes hold, and the next
    // line is served.
    let long = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"status\",\"pad\":\"{}\"}}\n",
        "x".repeat(300)
    );
    w.send_raw(long).unwrap();
    let r = within(w.next_unmatched()).await.unwrap();
    assert_eq!((r.id.clone(), code(&r)), (Some(16.into()), -32600));
    // Unknown notifications and blank lines get nothing; CRLF works.
    w.send_raw("{\"jsonrpc\":\"2.0\",\"method\":\"whatever\"}\n\n\r\n")
        .unwrap();
    w.send_raw("{\"jsonrpc\":\"2.0\",\"id\":17,\"method\":\"status\"}\r\n")
        .unwrap();
    let r = within(w.next_unmatched()).await.unwrap();
    assert_eq!(r.id, Some(17.into()));
    assert!(r.outcome.is_ok());
    let status = within(w.call::<Status>(&StatusParams {})).await.unwrap();
    assert_eq!(status.state, WorkerState::Idle);
    assert!(status.requests_served >= 5, "{}", status.requests_served);
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
    assert!(
        w.stray_stdout_lines().is_empty(),
        "{:?}",
        w.stray_stdout_lines()
    );
}

#[tokio::test]
async fn initialize_reports_the_protocol_and_the_queue() {
    let w = worker(&["--max-queue", "3"]);
    let init = within(w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert_eq!(init.protocol_version, "1");
    assert_eq!(init.worker.name, "mlx-worker");
    assert_eq!(init.capabilities.max_queue, 3);
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn initialize_takes_a_client_without_a_version() {
    // As LSP's `clientInfo`: a host may name itself without a version.
    let w = worker(&[]);
    let init = within(w.request_value(
        "initialize",
        json!({"client": {"name": "my-host"}, "protocol_version": "1"}),
    ))
    .await
    .unwrap();
    assert_eq!(init["protocol_version"], "1", "{init}");
    let refused = within(w.request_value("initialize", json!({"client": {"version": "1"}})))
        .await
        .unwrap_err();
    assert!(format!("{refused:?}").contains("name"), "{refused:?}");
    within(w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn shutdown_answers_then_exits_zero_and_refuses_new_work() {
    let w = worker(&[]);
    w.send_raw(
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"shutdown\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"reset\"}\n",
    )
    .unwrap();
    let first = within(w.next_unmatched()).await.unwrap();
    assert_eq!(first.id, Some(1.into()));
    assert_eq!(first.outcome.unwrap(), json!({}));
    // The worker may exit before it reads the next line; if it answers, it is an error.
    if let Some(second) = within(w.next_unmatched()).await {
        assert_eq!(second.id, Some(2.into()));
        assert_eq!(code(&second), ErrorCode::InvalidRequest.code());
    }
    assert_eq!(within(w.wait()).await.unwrap().code(), Some(0));
    let err = within(w.request_value("status", Value::Null))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::WorkerExited { .. } | ClientError::StdinClosed
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn end_of_stdin_exits_zero_within_a_second() {
    let w = worker(&[]);
    within(w.call::<Status>(&StatusParams {})).await.unwrap();
    let t = Instant::now();
    w.close_stdin();
    assert_eq!(within(w.wait()).await.unwrap().code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[tokio::test]
async fn sigterm_and_sigint_exit_zero_within_a_second() {
    for sig in ["-TERM", "-INT"] {
        let w = worker(&[]);
        within(w.call::<Status>(&StatusParams {})).await.unwrap();
        let t = Instant::now();
        let pid = w.pid().unwrap().to_string();
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
        assert_eq!(within(w.wait()).await.unwrap().code(), Some(0), "{sig}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{sig}: {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn help_and_version() {
    let bin = env!("CARGO_BIN_EXE_mlx-worker");
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("mlx-worker "));
    let out = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--max-line-bytes") && help.contains("--max-queue"),
        "{help}"
    );
    let out = std::process::Command::new(bin)
        .args(["--max-queue", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let _ = BusyData { max_queue: 0 };
}

#[tokio::test]
async fn runs_from_another_directory_with_an_empty_environment() {
    // libmlx is found through the binary's own rpath: no LD_LIBRARY_PATH, no HOME, no PATH.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"));
    command.env_clear().current_dir(std::env::temp_dir());
    let w = protocol::Client::spawn_command(command, Default::default()).unwrap();
    let init = within(w.call::<Initialize>(&InitializeParams::default()))
        .await
        .unwrap();
    assert!(
        init.mlx.version.starts_with("0.32."),
        "{}",
        init.mlx.version
    );
    assert_eq!(init.mlx.backend, protocol::methods::Backend::Cpu);
    within(w.shutdown()).await.unwrap();
}

#[test]
fn piped_requests_are_all_answered_before_the_exit_at_end_of_stdin() {
    use std::io::{Read, Write};
    // `initialize` waits for the engine to start; end of stdin comes right after it.
    let mut child = crate::support::raw_worker();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tokenize\",\"params\":{\"text\":\"hi\"}}\n",
        )
        .unwrap();
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{out}");
    let initialize = answers
        .iter()
        .find(|a| a["id"] == 1)
        .expect("initialize answered");
    assert_eq!(initialize["result"]["protocol_version"], "1", "{out}");
    // No model is loaded: tokenize is answered with an error, but answered.
    let tokenize = answers
        .iter()
        .find(|a| a["id"] == 2)
        .expect("tokenize answered");
    assert!(tokenize["error"]["code"].is_i64(), "{out}");
}
