#![warn(missing_docs)]
//! The protocol between `mlx-worker` and its host: JSON-RPC 2.0, one message per line, over the
//! worker's stdin and stdout.
//!
//! - [`Message`] (with [`Request`], [`Response`], [`Notification`]) is the envelope;
//!   [`ResponseError`] and [`ErrorCode`] are the contract's errors.
//! - [`methods`] has every method's name, params and result, and every notification.
//! - [`codec`] frames lines (with a length limit) and decodes them into messages.
//! - [`client`] spawns a worker and talks to it (for hosts, tests and xtask).
//! - [`schema`] renders the JSON Schema checked in at `protocol/schema.json`.
//!
//! The contract in words is `protocol.md`; this crate is its single source of truth in code.

pub mod client;
pub mod codec;
pub mod envelope;
pub mod error;
pub mod methods;
pub mod params;
pub mod schema;
pub mod secret;

pub use client::{Client, ClientError, ClientOptions, GenerateHandle};
pub use codec::{
    decode_message, encode_message, LineError, LineFramer, LineReader, MessageReader,
    MessageWriter, DEFAULT_MAX_LINE_BYTES,
};
pub use envelope::{
    InvalidMessage, Message, Notification, Request, RequestId, Response, JSONRPC_VERSION,
};
pub use error::{ErrorCode, LoadErrorKind, ResponseError};
pub use methods::{Method, NotificationMethod, PROTOCOL_VERSION};
pub use params::parse_params;
pub use secret::Secret;
