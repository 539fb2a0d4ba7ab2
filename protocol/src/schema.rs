//! The JSON Schema of every message, as checked in at `protocol/schema.json`.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::envelope::Message;
use crate::error::{ErrorCode, ResponseError};
use crate::methods::*;

/// The protocol's JSON Schema (draft 2020-12): `$defs` holds every type; `methods` maps each
/// method to the `$ref` of its params and result, `notifications` each notification to its
/// params, `errors` each error code to its `data`.
pub fn protocol_schema() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut methods = Map::new();
    let mut notifications = Map::new();

    macro_rules! methods {
        ($($m:ty),*) => {$(
            let params = generator.subschema_for::<<$m as Method>::Params>();
            let result = generator.subschema_for::<<$m as Method>::Result>();
            methods.insert(<$m>::NAME.into(), json!({ "params": params, "result": result }));
        )*};
    }
    macro_rules! notifications {
        ($($n:ty),*) => {$(
            let params = generator.subschema_for::<<$n as NotificationMethod>::Params>();
            notifications.insert(<$n>::NAME.into(), json!({ "params": params }));
        )*};
    }
    crate::for_each_method!(methods);
    notifications!(
        LoadProgressNotification,
        GenerateDeltaNotification,
        CancelRequestNotification,
        CancelledNotification
    );

    let message = generator.subschema_for::<Message>();
    let error = generator.subschema_for::<ResponseError>();
    let errors: Map<String, Value> = ErrorCode::ALL
        .into_iter()
        .map(|code| {
            let data = code.data_schema(&mut generator);
            (code.code().to_string(), json!(data))
        })
        .collect();
    let defs = generator.take_definitions(true);

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mlx-worker protocol",
        "description": "JSON-RPC 2.0 over stdio, one message per line. `methods`, `notifications` and `errors` are indexes into `$defs`.",
        "protocol_version": PROTOCOL_VERSION,
        "$ref": message.get("$ref"),
        "error": error,
        "methods": methods,
        "notifications": notifications,
        "errors": errors,
        "$defs": defs,
    })
}

/// [`protocol_schema`] as pretty-printed JSON with a trailing newline: the contents of
/// `protocol/schema.json`.
pub fn protocol_schema_string() -> String {
    let mut text = serde_json::to_string_pretty(&protocol_schema()).expect("schema serialises");
    text.push('\n');
    text
}

/// The schema of one type, for hosts that validate a single message kind.
pub fn schema_for<T: JsonSchema>() -> Value {
    SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}
