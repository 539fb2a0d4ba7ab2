//! Framing and decoding edge cases.

use protocol::{
    decode_message, ErrorCode, LineError, LineFramer, LineReader, Message, MessageReader,
    MessageWriter, Notification, Request, RequestId, Response, ResponseError,
};
use serde_json::json;
use tokio::io::BufReader;

/// Every line (or line error) of `input`, read with `limit` through a reader whose buffer is
/// `buf` bytes, so lines straddle reads.
async fn lines(input: &[u8], limit: usize, buf: usize) -> Vec<Result<String, String>> {
    let mut reader = LineReader::new(BufReader::with_capacity(buf, input), limit);
    let mut out = Vec::new();
    while let Some(line) = reader.next_line().await {
        out.push(line.map_err(|e| match e {
            LineError::TooLong { limit, .. } => format!("too long {limit}"),
            LineError::InvalidUtf8 { valid_up_to } => format!("utf8 {valid_up_to}"),
            LineError::Io(e) => format!("io {e}"),
        }));
    }
    out
}

fn ok(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

#[tokio::test]
async fn splits_lf_and_crlf_and_skips_blank_lines() {
    for buf in [1, 2, 3, 7, 64] {
        let got = lines(b"a\r\nb\n\n\r\n  \t \nc\n", 10, buf).await;
        assert_eq!(got, vec![ok("a"), ok("b"), ok("c")], "buffer {buf}");
    }
}

#[tokio::test]
async fn partial_final_line_at_eof_is_a_line() {
    assert_eq!(lines(b"a\nlast", 10, 3).await, vec![ok("a"), ok("last")]);
    assert_eq!(lines(b"a\nlast\r", 10, 3).await, vec![ok("a"), ok("last")]);
    assert_eq!(lines(b"", 10, 3).await, vec![]);
}

#[tokio::test]
async fn exactly_at_limit_passes_one_over_is_discarded_and_reading_goes_on() {
    for buf in [1, 4, 5, 6, 100] {
        let got = lines(b"12345\n123456\nok\n", 5, buf).await;
        assert_eq!(
            got,
            vec![ok("12345"), Err("too long 5".into()), ok("ok")],
            "buffer {buf}"
        );
    }
}

#[tokio::test]
async fn the_carriage_return_counts_toward_the_limit() {
    assert_eq!(
        lines(b"12345\r\nabc\r\n", 5, 3).await,
        vec![Err("too long 5".into()), ok("abc")]
    );
}

#[tokio::test]
async fn over_long_final_line_without_newline_is_reported() {
    assert_eq!(
        lines(b"ok\n0123456789", 5, 4).await,
        vec![ok("ok"), Err("too long 5".into())]
    );
}

#[tokio::test]
async fn several_over_long_lines_in_a_row() {
    let input = [
        vec![b'x'; 100],
        b"\n".to_vec(),
        vec![b'y'; 7],
        b"\nz\n".to_vec(),
    ]
    .concat();
    assert_eq!(
        lines(&input, 6, 8).await,
        vec![Err("too long 6".into()), Err("too long 6".into()), ok("z")]
    );
}

#[test]
fn framer_never_buffers_more_than_the_limit() {
    let mut framer = LineFramer::new(16);
    let chunk = [b'a'; 10];
    for _ in 0..1000 {
        let (n, line) = framer.feed(&chunk);
        assert_eq!(n, 10);
        assert!(line.is_none());
    }
    // The internal buffer was dropped when the line went over the limit.
    assert!(format!("{framer:?}").contains("buf: []"), "{framer:?}");
    let (n, line) = framer.feed(b"tail\nnext\n");
    assert_eq!(n, 5);
    assert!(matches!(
        line,
        Some(Err(LineError::TooLong {
            limit: 16,
            id: None
        }))
    ));
    let (n, line) = framer.feed(b"next\n");
    assert_eq!(n, 5);
    assert_eq!(line.unwrap().unwrap(), "next");
}

#[tokio::test]
async fn an_over_long_line_is_answered_with_its_id_when_its_first_bytes_hold_it() {
    let long = "x".repeat(100_000);
    let cases = [
        (
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"generate","params":{{"p":"{long}"}}}}"#),
            Some(RequestId::Number(7)),
        ),
        (
            format!(r#"{{ "method": "generate", "id" : "gen-\"7\"", "params": "{long}"}}"#),
            Some(RequestId::String("gen-\"7\"".into())),
        ),
        // `id` after a value that is cut off, or no id at all: a null id, as before.
        (format!(r#"{{"params":"{long}","id":7}}"#), None),
        (
            format!(r#"{{"method":"x","params":{{"id":3,"p":"{long}"}}}}"#),
            None,
        ),
        (format!("[{long}]"), None),
    ];
    for (line, id) in cases {
        let input = format!("{line}\n");
        // Read in small pieces, so the head is gathered across reads.
        let mut reader = LineReader::new(BufReader::with_capacity(1000, input.as_bytes()), 1024);
        match reader.next_line().await {
            Some(Err(e @ LineError::TooLong { .. })) => {
                assert_eq!(e.to_response().id, id, "{}", &line[..60])
            }
            other => panic!("expected too long, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn invalid_utf8_is_its_own_error_and_reading_goes_on() {
    assert_eq!(
        lines(b"ab\xff\xfe\n{}\n", 64, 2).await,
        vec![Err("utf8 2".into()), ok("{}")]
    );
    // A multi-byte character split across reads is fine.
    assert_eq!(lines("é€😀\n".as_bytes(), 64, 1).await, vec![ok("é€😀")]);
}

fn error_of(response: &Response) -> &ResponseError {
    response.outcome.as_ref().unwrap_err()
}

#[test]
fn not_json_is_a_parse_error_with_null_id() {
    for line in ["{", "hello", "{\"id\": 1,}", "nul"] {
        let response = decode_message(line).unwrap_err();
        assert_eq!(response.id, None, "{line}");
        assert_eq!(error_of(&response).code, -32700, "{line}");
    }
}

#[test]
fn batches_and_non_objects_are_invalid_requests() {
    for line in [
        "[]",
        "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\"}]",
        "1",
        "\"s\"",
        "null",
        "true",
    ] {
        let response = decode_message(line).unwrap_err();
        assert_eq!(response.id, None, "{line}");
        assert_eq!(error_of(&response).code, -32600, "{line}");
    }
}

#[test]
fn invalid_requests_carry_the_id_when_it_can_be_read() {
    let cases = [
        (r#"{"jsonrpc":"2.0","id":5}"#, Some(RequestId::Number(5))),
        (
            r#"{"jsonrpc":"2.0","id":"a","method":7}"#,
            Some(RequestId::from("a")),
        ),
        (
            r#"{"jsonrpc":"1.0","id":6,"method":"status"}"#,
            Some(RequestId::Number(6)),
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"status","params":3}"#,
            Some(RequestId::Number(7)),
        ),
        (r#"{"jsonrpc":"2.0","id":1.5,"method":"status"}"#, None),
        (r#"{"jsonrpc":"2.0","id":{},"method":"status"}"#, None),
        (r#"{"jsonrpc":"2.0"}"#, None),
    ];
    for (line, id) in cases {
        let response = decode_message(line).unwrap_err();
        assert_eq!(response.id, id, "{line}");
        assert_eq!(
            error_of(&response).error_code(),
            Some(ErrorCode::InvalidRequest),
            "{line}"
        );
    }
}

#[test]
fn classifies_requests_notifications_and_responses() {
    let m = decode_message(r#"{"jsonrpc":"2.0","id":"x","method":"status","extra":1}"#).unwrap();
    assert_eq!(
        m,
        Message::Request(Request {
            id: "x".into(),
            method: "status".into(),
            params: serde_json::Value::Null
        })
    );
    // A missing `jsonrpc` is tolerated; a null id makes a notification.
    let m = decode_message(r#"{"id":null,"method":"$/cancelRequest","params":{"id":3}}"#).unwrap();
    assert!(
        matches!(m, Message::Notification(Notification { ref method, .. }) if method == "$/cancelRequest")
    );
    let m = decode_message(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#)
        .unwrap();
    assert!(matches!(
        m,
        Message::Response(Response {
            id: None,
            outcome: Err(_)
        })
    ));
    let m = decode_message(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#).unwrap();
    assert!(matches!(
        m,
        Message::Response(Response {
            id: Some(RequestId::Number(2)),
            outcome: Ok(_)
        })
    ));
}

#[test]
fn messages_round_trip_through_the_wire_form() {
    let messages = [
        Message::Request(Request::new(1.into(), "status", json!({}))),
        Message::Request(Request::new(
            "abc".into(),
            "shutdown",
            serde_json::Value::Null,
        )),
        Message::Notification(Notification::new(
            "generate/delta",
            json!({"request_id": 1, "index": 0, "text": "a\nb"}),
        )),
        Message::Response(Response::ok(2.into(), json!({"cancelled": true}))),
        Message::Response(Response::err(None, ResponseError::parse_error("x"))),
        Message::Response(Response::err(Some(3.into()), ResponseError::busy(16))),
    ];
    for message in messages {
        let bytes = protocol::encode_message(&message);
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(bytes.ends_with(b"\n"));
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["jsonrpc"], "2.0");
        let line = std::str::from_utf8(&bytes).unwrap().trim_end();
        assert_eq!(decode_message(line).unwrap(), message);
    }
    // The null id of an error response is written out, not omitted.
    let bytes = protocol::encode_message(&Message::Response(Response::err(
        None,
        ResponseError::parse_error("x"),
    )));
    assert!(std::str::from_utf8(&bytes).unwrap().contains("\"id\":null"));
}

#[tokio::test]
async fn message_reader_turns_bad_lines_into_responses_and_goes_on() {
    let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\"}\nnot json\n\xff\n[1]\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n{\"method\":\"m\"}";
    let mut reader = MessageReader::new(BufReader::with_capacity(5, &input[..]), 64);
    let mut codes = Vec::new();
    while let Some(item) = reader.next_message().await {
        match item.unwrap() {
            Ok(Message::Request(r)) => codes.push(format!("request {}", r.method)),
            Ok(Message::Notification(n)) => codes.push(format!("notification {}", n.method)),
            Ok(Message::Response(_)) => codes.push("response".into()),
            Err(response) => {
                assert_eq!(response.id, None);
                codes.push(error_of(&response).code.to_string())
            }
        }
    }
    assert_eq!(
        codes,
        [
            "request status",
            "-32700",
            "-32700",
            "-32600",
            "-32600",
            "notification m"
        ]
    );
}

#[tokio::test]
async fn writer_writes_one_flushed_line_per_message() {
    let mut writer = MessageWriter::new(Vec::new());
    writer
        .write(&Message::Notification(Notification::new(
            "a",
            json!({"text": "x\ny"}),
        )))
        .await
        .unwrap();
    writer
        .write(&Message::Response(Response::ok(1.into(), json!({}))))
        .await
        .unwrap();
    let out = String::from_utf8(writer.into_inner()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[1], r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
}
