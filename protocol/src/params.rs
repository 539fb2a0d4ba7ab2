//! Decoding `params` into typed structs, with bad fields reported as
//! [`InvalidParams`](crate::ErrorCode::InvalidParams) `{field, reason}`.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::envelope::json_kind;
use crate::error::ResponseError;

/// Decodes a request's or notification's `params` into `P`.
///
/// Absent (`null`) params decode as `{}`. Positional (array) params are refused. A serde error
/// becomes [`InvalidParams`](crate::ErrorCode::InvalidParams) whose `data.field` is the JSON
/// path of the offending field (`.` for the params as a whole) and `data.reason` serde's
/// explanation. A request's params refuse fields their method does not define (each params
/// struct denies unknown fields, `data.field` names the unknown one): a field the worker does
/// not know, silently ignored, would let a host believe it held (a `response_format` that
/// constrains nothing). Notifications' params ignore them: no answer could say so.
pub fn parse_params<P: DeserializeOwned>(params: &Value) -> Result<P, ResponseError> {
    let empty;
    let params = match params {
        Value::Null => {
            empty = Value::Object(Map::new());
            &empty
        }
        Value::Object(_) => params,
        other => {
            return Err(ResponseError::invalid_params(
                ".",
                format!(
                    "params must be an object of named fields, not {}",
                    json_kind(other)
                ),
            ))
        }
    };
    serde_path_to_error::deserialize(params).map_err(|e| {
        let (field, reason) = field_of(&e.path().to_string(), &e.inner().to_string());
        ResponseError::invalid_params(field, reason)
    })
}

/// The path of the bad field. serde reports a missing field at its parent's path, with the
/// field's name only in the message, so the name is appended here. At the top level, a field
/// unknown to a struct with a flattened member is reported the same way, and a flattened
/// member's own errors carry their field as [`flattened`] writes it.
fn field_of(path: &str, reason: &str) -> (String, String) {
    let named = |prefix: &str| {
        reason
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('`').next())
            .map(str::to_owned)
    };
    if let Some(name) = named("missing field `") {
        let field = match path {
            "." => name,
            parent => format!("{parent}.{name}"),
        };
        return (field, reason.to_owned());
    }
    if path == "." {
        if let Some(name) = named("unknown field `") {
            return (name, reason.to_owned());
        }
        if let Some((field, inner)) = reason
            .strip_prefix(FLATTENED)
            .and_then(|rest| rest.split_once(FLATTENED))
        {
            return (field.to_owned(), inner.to_owned());
        }
    }
    (path.to_owned(), reason.to_owned())
}

/// Marks the field path [`flattened`] puts in front of its reason.
const FLATTENED: &str = "\u{1f}";

/// `deserialize_with` for a `#[serde(flatten)]` member (with `Sampling`, `generate`'s sampler
/// settings): serde hands a flattened member its fields without their paths, so an error there
/// would name no field. This one keeps the path and writes it into the message, from which
/// [`parse_params`] takes it back.
pub(crate) fn flattened<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        serde::de::Error::custom(format!("{FLATTENED}{}{FLATTENED}{}", e.path(), e.inner()))
    })
}

/// Params with the `required` fields given and every other field at the contract's default: the
/// serde defaults a request without those fields gets, so constructors such as
/// [`GenerateParams::new`](crate::methods::GenerateParams::new) restate none of them.
///
/// # Panics
/// Panics if `required` is not valid params of `P`: a bug in the calling constructor.
pub(crate) fn with_defaults<P: DeserializeOwned>(required: Value) -> P {
    parse_params(&required).expect("required fields plus defaults are valid params")
}
