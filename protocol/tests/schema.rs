//! `protocol/schema.json` must match the types; regenerate with
//! `UPDATE_SCHEMA=1 cargo test -p protocol --test schema`.

use std::path::Path;

#[test]
fn checked_in_schema_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.json");
    let expected = protocol::schema::protocol_schema_string();
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &expected).expect("write schema.json");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "protocol/schema.json is stale: regenerate it with \
         `UPDATE_SCHEMA=1 cargo test -p protocol --test schema` and commit it"
    );
}

#[test]
fn schema_indexes_every_method_and_notification() {
    let schema = protocol::schema::protocol_schema();
    for name in protocol::methods::METHOD_NAMES {
        let entry = &schema["methods"][name];
        assert!(entry["params"]["$ref"].is_string(), "{name} params");
        assert!(entry["result"]["$ref"].is_string(), "{name} result");
    }
    for name in [
        "load/progress",
        "generate/delta",
        "$/cancelRequest",
        "notifications/cancelled",
    ] {
        assert!(
            schema["notifications"][name]["params"]["$ref"].is_string(),
            "{name}"
        );
    }
    // hf_token is documented as a plain string, and the GenerateParams defaults are recorded.
    let generate = &schema["$defs"]["GenerateParams"]["properties"];
    assert_eq!(
        generate["temperature"]["default"],
        serde_json::json!(0.7),
        "{generate}"
    );
}

#[test]
fn error_data_descriptions_name_their_code() {
    let schema = protocol::schema::protocol_schema();
    for code in protocol::ErrorCode::ALL {
        let number = code.code().to_string();
        let Some(reference) = schema["errors"][&number]["$ref"].as_str() else {
            continue;
        };
        let name = reference.rsplit('/').next().unwrap();
        let description = schema["$defs"][name]["description"].as_str().unwrap();
        assert!(description.contains(&number), "{name}: {description}");
    }
}
