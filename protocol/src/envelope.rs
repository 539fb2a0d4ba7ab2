//! The JSON-RPC 2.0 envelope: request ids and the one [`Message`] enum.
//!
//! Every line on the wire is one [`Message`]. Serialising always writes `"jsonrpc": "2.0"`;
//! reading accepts a missing `jsonrpc` member (people piping JSON by hand forget it) but rejects
//! any other value. Unknown members are ignored, so hosts may add fields freely.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ResponseError};

/// The value of the `jsonrpc` member of every message.
pub const JSONRPC_VERSION: &str = "2.0";

/// The id of a request: a JSON number (integer) or a string, echoed verbatim in its response.
///
/// Two ids are equal only when they have the same kind and value: `1` and `"1"` differ.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id, e.g. `7`.
    Number(i64),
    /// A string id, e.g. `"gen-7"`.
    String(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for RequestId {
    fn from(n: i64) -> Self {
        RequestId::Number(n)
    }
}

impl From<String> for RequestId {
    fn from(s: String) -> Self {
        RequestId::String(s)
    }
}

impl From<&str> for RequestId {
    fn from(s: &str) -> Self {
        RequestId::String(s.to_owned())
    }
}

/// A call that expects exactly one [`Response`] with the same `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The id the response will carry.
    pub id: RequestId,
    /// The method name, e.g. `"generate"`.
    pub method: String,
    /// The `params` member; [`Value::Null`] when it was absent.
    pub params: Value,
}

impl Request {
    /// Builds a request whose params are the JSON form of `params`.
    ///
    /// # Panics
    /// Panics if `params` cannot be represented as JSON (a map with non-string keys); the
    /// protocol's own params types never do that.
    pub fn new(id: RequestId, method: impl Into<String>, params: impl Serialize) -> Self {
        Request {
            id,
            method: method.into(),
            params: serde_json::to_value(params).expect("params serialise to JSON"),
        }
    }

    /// Decodes `params` into `P`, reporting a bad field as
    /// [`InvalidParams`](crate::ErrorCode::InvalidParams) with `data {field, reason}`. Absent or
    /// `null` params decode as `{}`, so methods whose params are all optional accept a bare
    /// request.
    pub fn parse_params<P: DeserializeOwned>(&self) -> Result<P, ResponseError> {
        crate::params::parse_params(&self.params)
    }
}

/// The answer to a [`Request`]: exactly one of `result` and `error`.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id of the request answered; `None` (JSON `null`) when the request's id could not be
    /// read, e.g. for a parse error.
    pub id: Option<RequestId>,
    /// `Ok(result)` or `Err(error)`.
    pub outcome: Result<Value, ResponseError>,
}

impl Response {
    /// A successful response carrying the JSON form of `result`.
    ///
    /// # Panics
    /// Panics if `result` cannot be represented as JSON; the protocol's result types always can.
    pub fn ok(id: RequestId, result: impl Serialize) -> Self {
        Response {
            id: Some(id),
            outcome: Ok(serde_json::to_value(result).expect("result serialises to JSON")),
        }
    }

    /// An error response; `id` is `None` when the request's id is unknown.
    pub fn err(id: Option<RequestId>, error: ResponseError) -> Self {
        Response {
            id,
            outcome: Err(error),
        }
    }

    /// Decodes the result into `R`; an error response is returned as is.
    pub fn into_result<R: DeserializeOwned>(self) -> Result<R, ResponseError> {
        let value = self.outcome?;
        serde_json::from_value(value).map_err(|e| {
            ResponseError::new(
                ErrorCode::InternalError,
                format!("the response's result does not have the expected shape: {e}"),
            )
        })
    }
}

/// A one-way message: no response is ever sent for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The notification's name, e.g. `"generate/delta"`.
    pub method: String,
    /// The `params` member; [`Value::Null`] when it was absent.
    pub params: Value,
}

impl Notification {
    /// Builds a notification whose params are the JSON form of `params`.
    ///
    /// # Panics
    /// Panics if `params` cannot be represented as JSON; the protocol's own types always can.
    pub fn new(method: impl Into<String>, params: impl Serialize) -> Self {
        Notification {
            method: method.into(),
            params: serde_json::to_value(params).expect("params serialise to JSON"),
        }
    }

    /// Decodes `params` into `P`, reporting a bad field as
    /// [`InvalidParams`](crate::ErrorCode::InvalidParams) with `data {field, reason}`.
    pub fn parse_params<P: DeserializeOwned>(&self) -> Result<P, ResponseError> {
        crate::params::parse_params(&self.params)
    }
}

/// One JSON-RPC 2.0 message: what one line of the wire carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A call that expects a response (it has an `id` and a `method`).
    Request(Request),
    /// The answer to a request (it has an `id` and a `result` or an `error`).
    Response(Response),
    /// A one-way message (a `method` and no `id`).
    Notification(Notification),
}

impl From<Request> for Message {
    fn from(r: Request) -> Self {
        Message::Request(r)
    }
}

impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Message::Response(r)
    }
}

impl From<Notification> for Message {
    fn from(n: Notification) -> Self {
        Message::Notification(n)
    }
}

/// Why a JSON value is not a [`Message`]: always an invalid request
/// ([`InvalidRequest`](crate::ErrorCode::InvalidRequest)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidMessage {
    /// The request's id when one could be read, so the error response can carry it.
    pub id: Option<RequestId>,
    /// What is wrong, in words for the sender.
    pub reason: String,
}

impl InvalidMessage {
    fn new(id: Option<RequestId>, reason: impl Into<String>) -> Self {
        InvalidMessage {
            id,
            reason: reason.into(),
        }
    }

    /// The [`InvalidRequest`](crate::ErrorCode::InvalidRequest) error response the receiver
    /// sends back.
    pub fn into_response(self) -> Response {
        Response::err(
            self.id,
            ResponseError::new(
                ErrorCode::InvalidRequest,
                format!("invalid request: {}", self.reason),
            ),
        )
    }
}

impl Message {
    /// Classifies a parsed JSON value the way the contract says: a batch (array) or any other
    /// non-object, a missing or non-string `method` without `result`/`error`, a bad `id` or a
    /// wrong `jsonrpc` are invalid requests, carrying the id when it could be read.
    pub fn from_value(value: Value) -> Result<Message, InvalidMessage> {
        let mut obj = match value {
            Value::Object(obj) => obj,
            Value::Array(_) => {
                return Err(InvalidMessage::new(
                    None,
                    "batches (JSON arrays) are not supported; send one message per line",
                ))
            }
            other => {
                return Err(InvalidMessage::new(
                    None,
                    format!("a message must be a JSON object, not {}", json_kind(&other)),
                ))
            }
        };

        // Read the id first so that every later complaint can be answered to it.
        let id = match obj.remove("id") {
            None => None,
            Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_i64() {
                Some(n) => Some(RequestId::Number(n)),
                None => {
                    return Err(InvalidMessage::new(
                        None,
                        format!("`id` must be an integer or a string, not {n}"),
                    ))
                }
            },
            Some(Value::String(s)) => Some(RequestId::String(s)),
            Some(other) => {
                return Err(InvalidMessage::new(
                    None,
                    format!(
                        "`id` must be an integer or a string, not {}",
                        json_kind(&other)
                    ),
                ))
            }
        };

        match obj.get("jsonrpc") {
            None => {}
            Some(Value::String(v)) if v == JSONRPC_VERSION => {}
            Some(other) => {
                return Err(InvalidMessage::new(
                    id,
                    format!("`jsonrpc` must be \"2.0\", not {other}"),
                ))
            }
        }

        let params = obj.remove("params").unwrap_or(Value::Null);
        if !matches!(params, Value::Object(_) | Value::Array(_) | Value::Null) {
            return Err(InvalidMessage::new(
                id,
                format!(
                    "`params` must be an object or an array, not {}",
                    json_kind(&params)
                ),
            ));
        }

        match obj.remove("method") {
            Some(Value::String(method)) => Ok(match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            }),
            Some(other) => Err(InvalidMessage::new(
                id,
                format!("`method` must be a string, not {}", json_kind(&other)),
            )),
            None => response_from_object(id, obj),
        }
    }

    /// The JSON form of this message, with `"jsonrpc": "2.0"`.
    pub fn to_value(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("jsonrpc".into(), Value::from(JSONRPC_VERSION));
        match self {
            Message::Request(r) => {
                obj.insert("id".into(), id_value(Some(&r.id)));
                obj.insert("method".into(), Value::from(r.method.as_str()));
                if !r.params.is_null() {
                    obj.insert("params".into(), r.params.clone());
                }
            }
            Message::Notification(n) => {
                obj.insert("method".into(), Value::from(n.method.as_str()));
                if !n.params.is_null() {
                    obj.insert("params".into(), n.params.clone());
                }
            }
            Message::Response(r) => {
                obj.insert("id".into(), id_value(r.id.as_ref()));
                match &r.outcome {
                    Ok(result) => obj.insert("result".into(), result.clone()),
                    Err(error) => obj.insert(
                        "error".into(),
                        serde_json::to_value(error).expect("errors serialise"),
                    ),
                };
            }
        }
        Value::Object(obj)
    }
}

fn response_from_object(
    id: Option<RequestId>,
    mut obj: Map<String, Value>,
) -> Result<Message, InvalidMessage> {
    let result = obj.remove("result");
    let error = obj.remove("error");
    match (result, error) {
        (Some(result), None) => match id {
            Some(id) => Ok(Message::Response(Response {
                id: Some(id),
                outcome: Ok(result),
            })),
            None => Err(InvalidMessage::new(
                None,
                "a result must carry the `id` it answers",
            )),
        },
        (None, Some(error)) => match serde_json::from_value::<ResponseError>(error) {
            Ok(error) => Ok(Message::Response(Response {
                id,
                outcome: Err(error),
            })),
            Err(e) => Err(InvalidMessage::new(
                id,
                format!("`error` must be {{code, message, data?}}: {e}"),
            )),
        },
        (Some(_), Some(_)) => Err(InvalidMessage::new(
            id,
            "a response carries `result` or `error`, not both",
        )),
        (None, None) => Err(InvalidMessage::new(
            id,
            "the message has no `method` (a request or notification needs one)",
        )),
    }
}

fn id_value(id: Option<&RequestId>) -> Value {
    match id {
        None => Value::Null,
        Some(RequestId::Number(n)) => Value::from(*n),
        Some(RequestId::String(s)) => Value::from(s.as_str()),
    }
}

/// Names a JSON value's kind for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Message::from_value(value).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Message {
    fn schema_name() -> Cow<'static, str> {
        "Message".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let id = generator.subschema_for::<RequestId>();
        let error = generator.subschema_for::<ResponseError>();
        json_schema!({
            "description": "One JSON-RPC 2.0 message, one per line: a request, a response or a notification.",
            "oneOf": [
                {
                    "title": "Request",
                    "type": "object",
                    "properties": {
                        "jsonrpc": { "const": "2.0" },
                        "id": id,
                        "method": { "type": "string" },
                        "params": { "type": ["object", "array"] }
                    },
                    "required": ["id", "method"]
                },
                {
                    "title": "Notification",
                    "type": "object",
                    "properties": {
                        "jsonrpc": { "const": "2.0" },
                        "method": { "type": "string" },
                        "params": { "type": ["object", "array"] }
                    },
                    "required": ["method"],
                    "not": { "required": ["id"] }
                },
                {
                    "title": "Response",
                    "type": "object",
                    "properties": {
                        "jsonrpc": { "const": "2.0" },
                        "id": { "anyOf": [id, { "type": "null" }] },
                        "result": true,
                        "error": error
                    },
                    "required": ["id"],
                    "oneOf": [ { "required": ["result"] }, { "required": ["error"] } ]
                }
            ]
        })
    }
}
