//! Newline-delimited framing: lines in with a length limit, messages out one per line.
//!
//! Reading has three layers, each usable alone:
//! - [`LineFramer`]: synchronous; splits bytes into lines, enforcing the length limit without
//!   ever buffering more than the limit (an over-long line is skipped up to its newline).
//! - [`LineReader`]: the framer over any [`AsyncBufRead`] (wrap a plain reader in
//!   [`tokio::io::BufReader`]).
//! - [`MessageReader`]: lines decoded into [`Message`]s, bad ones turned into the error
//!   [`Response`] the contract prescribes ([`decode_message`]).
//!
//! Writing is [`MessageWriter`]: one message per line, flushed after each.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::envelope::{Message, RequestId, Response};
use crate::error::ResponseError;

/// The default limit of one line: 64 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// A line that could not be framed. [`LineError::Io`] ends the stream; the others are reported
/// and reading goes on with the next line.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// The line had more than `limit` bytes before its newline; it was discarded.
    #[error("line longer than {limit} bytes was discarded; send smaller messages or raise the limit (--max-line-bytes)")]
    TooLong {
        /// The limit in force.
        limit: usize,
        /// The request's id, when the line's first bytes had it ([`recover_id`]), so that a host
        /// waiting on that id gets this error.
        id: Option<RequestId>,
    },
    /// The line is not valid UTF-8.
    #[error("line is not valid UTF-8 (first bad byte at offset {valid_up_to})")]
    InvalidUtf8 {
        /// Bytes of the line before the first invalid one.
        valid_up_to: usize,
    },
    /// Reading failed; the stream is over.
    #[error("reading the input failed: {0}")]
    Io(#[from] std::io::Error),
}

impl LineError {
    /// The error response the contract prescribes, with a null id (an over-long line's id
    /// when its first bytes had one):
    /// [`InvalidRequest`](crate::ErrorCode::InvalidRequest) for too long,
    /// [`ParseError`](crate::ErrorCode::ParseError) for bad UTF-8,
    /// [`InternalError`](crate::ErrorCode::InternalError) for I/O.
    pub fn to_response(&self) -> Response {
        let (id, error) = match self {
            LineError::TooLong { limit, id } => (id.clone(), ResponseError::line_too_long(*limit)),
            LineError::InvalidUtf8 { .. } => (None, ResponseError::parse_error(self)),
            LineError::Io(e) => (None, ResponseError::internal(e)),
        };
        Response::err(id, error)
    }
}

/// Splits a byte stream into lines of at most `max_line_bytes` bytes (not counting the `\n`).
///
/// A trailing `\r` is removed (CRLF input works) but counts toward the limit. Lines that are
/// empty or only whitespace are skipped. The framer holds at most `max_line_bytes` bytes, plus
/// the first [`HEAD_BYTES`] of a line it is discarding (to find its id).
#[derive(Debug)]
pub struct LineFramer {
    max_line_bytes: usize,
    buf: Vec<u8>,
    discarding: bool,
    /// The first bytes of the line being discarded.
    head: Vec<u8>,
}

/// How much of an over-long line is kept to look for its id.
pub const HEAD_BYTES: usize = 4096;

impl LineFramer {
    /// A framer with this limit (bytes per line, newline excluded).
    pub fn new(max_line_bytes: usize) -> Self {
        LineFramer {
            max_line_bytes,
            buf: Vec::new(),
            discarding: false,
            head: Vec::new(),
        }
    }

    /// The limit in force.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }

    /// Consumes bytes from the front of `input`. Returns how many were consumed and, when a line
    /// ended within them, the line (or why it was rejected). Call again with the rest.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Option<Result<String, LineError>>) {
        match memchr_newline(input) {
            Some(end) => {
                let consumed = end + 1;
                if self.discarding {
                    self.discarding = false;
                    return (consumed, Some(Err(self.too_long())));
                }
                if self.buf.len() + end > self.max_line_bytes {
                    self.keep_head(&input[..end]);
                    return (consumed, Some(Err(self.too_long())));
                }
                self.buf.extend_from_slice(&input[..end]);
                (consumed, self.take_line())
            }
            None => {
                if !self.discarding {
                    if self.buf.len() + input.len() > self.max_line_bytes {
                        self.keep_head(input);
                        self.discarding = true;
                    } else {
                        self.buf.extend_from_slice(input);
                    }
                }
                (input.len(), None)
            }
        }
    }

    /// Ends the input: a last line without a newline is returned like any other.
    pub fn finish(&mut self) -> Option<Result<String, LineError>> {
        if self.discarding {
            self.discarding = false;
            return Some(Err(self.too_long()));
        }
        self.take_line()
    }

    /// Keeps the first [`HEAD_BYTES`] of the line so far and `more`, and frees the buffer.
    fn keep_head(&mut self, more: &[u8]) {
        let mut head = std::mem::take(&mut self.buf);
        head.truncate(HEAD_BYTES);
        let room = HEAD_BYTES - head.len();
        head.extend_from_slice(&more[..more.len().min(room)]);
        self.head = head;
    }

    fn too_long(&mut self) -> LineError {
        LineError::TooLong {
            limit: self.max_line_bytes,
            id: recover_id(&std::mem::take(&mut self.head)),
        }
    }

    /// Turns the buffered bytes into a line; `None` for a blank line.
    fn take_line(&mut self) -> Option<Result<String, LineError>> {
        let mut bytes = std::mem::take(&mut self.buf);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(
            String::from_utf8(bytes).map_err(|e| LineError::InvalidUtf8 {
                valid_up_to: e.utf8_error().valid_up_to(),
            }),
        )
    }
}

/// The `id` of a JSON-RPC request from the first bytes of its line, if they hold it: the
/// top-level object's keys are read in order (with serde_json) until `id`; a value cut off
/// before `id` comes (e.g. `params` first) means no id. Hosts write `id` before `params`.
pub fn recover_id(head: &[u8]) -> Option<RequestId> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct FindId<'a>(&'a mut Option<RequestId>);
    impl<'de> Visitor<'de> for FindId<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC request object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    *self.0 = Some(map.next_value()?);
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut id = None;
    // The object is cut off, so the whole parse always fails; the id, once read, stays.
    let _ = serde_json::Deserializer::from_slice(head).deserialize_map(FindId(&mut id));
    id
}

fn memchr_newline(input: &[u8]) -> Option<usize> {
    input.iter().position(|&b| b == b'\n')
}

/// Reads lines from an async source through a [`LineFramer`].
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    framer: LineFramer,
    done: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// A reader with this line limit.
    pub fn new(inner: R, max_line_bytes: usize) -> Self {
        LineReader {
            inner,
            framer: LineFramer::new(max_line_bytes),
            done: false,
        }
    }

    /// The next line; `None` at end of input. Blank lines are skipped. After `Err(Io)` or
    /// `None` every later call returns `None`.
    pub async fn next_line(&mut self) -> Option<Result<String, LineError>> {
        while !self.done {
            let available = match self.inner.fill_buf().await {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.done = true;
                    return Some(Err(LineError::Io(e)));
                }
            };
            if available.is_empty() {
                self.done = true;
                return self.framer.finish();
            }
            let (consumed, line) = self.framer.feed(available);
            self.inner.consume(consumed);
            if line.is_some() {
                return line;
            }
        }
        None
    }
}

/// Decodes one line into a [`Message`], or into the error [`Response`] to send back:
/// not JSON -> [`ParseError`](crate::ErrorCode::ParseError) (id null); a batch, a non-object,
/// no method, a bad id -> [`InvalidRequest`](crate::ErrorCode::InvalidRequest) (with the id
/// when it could be read).
pub fn decode_message(line: &str) -> Result<Message, Response> {
    let value: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| Response::err(None, ResponseError::parse_error(e)))?;
    Message::from_value(value).map_err(|e| e.into_response())
}

/// Reads [`Message`]s, one per line.
#[derive(Debug)]
pub struct MessageReader<R> {
    lines: LineReader<R>,
}

impl<R: AsyncBufRead + Unpin> MessageReader<R> {
    /// A reader with this line limit.
    pub fn new(inner: R, max_line_bytes: usize) -> Self {
        MessageReader {
            lines: LineReader::new(inner, max_line_bytes),
        }
    }

    /// The next message; `None` at end of input.
    ///
    /// `Err(response)` is a line that was rejected: send `response` back and keep reading.
    /// `Err(io)` is a failed read: the input is over.
    pub async fn next_message(
        &mut self,
    ) -> Option<Result<Result<Message, Response>, std::io::Error>> {
        let line = self.lines.next_line().await?;
        Some(match line {
            Ok(line) => Ok(decode_message(&line)),
            Err(LineError::Io(e)) => Err(e),
            Err(e) => Ok(Err(e.to_response())),
        })
    }
}

/// Writes [`Message`]s, one per line, flushing after each.
#[derive(Debug)]
pub struct MessageWriter<W> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> MessageWriter<W> {
    /// A writer over `inner` (e.g. `tokio::io::stdout()`).
    pub fn new(inner: W) -> Self {
        MessageWriter {
            inner,
            buf: Vec::new(),
        }
    }

    /// Writes one message and a newline, then flushes. JSON escapes newlines inside strings,
    /// so the message is always exactly one line.
    pub async fn write(&mut self, message: &Message) -> std::io::Result<()> {
        self.buf.clear();
        encode_message_into(message, &mut self.buf);
        self.inner.write_all(&self.buf).await?;
        self.inner.flush().await
    }

    /// The inner writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// The bytes of `message` as one line, newline included.
pub fn encode_message(message: &Message) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_message_into(message, &mut buf);
    buf
}

fn encode_message_into(message: &Message, buf: &mut Vec<u8>) {
    serde_json::to_writer(&mut *buf, message).expect("a Message always serialises");
    buf.push(b'\n');
}
