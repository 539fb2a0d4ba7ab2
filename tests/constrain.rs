//! Constrained output on the real SmolLM2 (byte-level BPE) and Gemma 3 270M (SentencePiece with
//! byte fallback) through the binary: every output the worker calls complete is valid against
//! its schema (checked by an independent validator, the `jsonschema` crate), matches its regex,
//! or parses with its grammar; bad constraints are -32602 before any compute.

use std::time::Duration;

use protocol::methods::{
    Channel, FinishReason, GenerateParams, GenerateResult, JsonSchemaFormat, Load, LoadParams,
    ResponseFormat,
};
use protocol::{Client, ErrorCode};
use serde_json::{json, Value};

use crate::support::{greedy, model_id, rpc_error, within_for, worker};

/// Twenty schemas of varied shapes; strings and arrays bounded so a 135M model ends them.
fn schemas() -> Vec<Value> {
    let name = json!({"type": "string", "minLength": 1, "maxLength": 16});
    // Unbounded, a small model can write digits until max_new_tokens (Gemma 3 270M did).
    let int = json!({"type": "integer", "minimum": -1000, "maximum": 1000});
    vec![
        json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"person": {"type": "object", "properties": {"name": name, "address": {"type": "object", "properties": {"street": name, "city": name}, "required": ["street", "city"], "additionalProperties": false}}, "required": ["name", "address"], "additionalProperties": false}}, "required": ["person"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4}),
        json!({"type": "array", "items": {"type": "object", "properties": {"id": int, "tag": name}, "required": ["id", "tag"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}),
        json!({"type": "object", "properties": {"done": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 12}}, "required": ["done", "note"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}, "required": ["code"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}}, "required": ["temperature"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}}, "required": ["stars"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"version": {"const": "v1"}, "ok": {"type": "boolean"}}, "required": ["version", "ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"value": {"anyOf": [int, {"type": "string", "maxLength": 8}]}}, "required": ["value"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "object", "properties": {"cat": name}, "required": ["cat"], "additionalProperties": false}, {"type": "object", "properties": {"dog": name}, "required": ["dog"], "additionalProperties": false}]}),
        json!({"type": "object", "properties": {"title": name, "subtitle": name, "year": int}, "required": ["title"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 6}}, "required": ["word"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "array", "items": {"type": "number", "minimum": -10, "maximum": 10}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
        json!({"$defs": {"point": {"type": "object", "properties": {"x": int, "y": int}, "required": ["x", "y"], "additionalProperties": false}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"scores": {"type": "object", "additionalProperties": int, "maxProperties": 3}}, "required": ["scores"], "additionalProperties": false}),
        json!({"enum": ["yes", "no", "maybe"]}),
        json!({"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}),
    ]
}

/// A 135M or 270M model on a slow CPU, a debug build.
const LIMIT: Duration = Duration::from_secs(240);

fn with_schema(prompt: &str, schema: &Value) -> GenerateParams {
    let mut p = greedy(prompt, 160);
    p.response_format = Some(ResponseFormat::JsonSchema {
        json_schema: JsonSchemaFormat {
            name: "answer".into(),
            description: None,
            schema: schema.clone(),
            strict: Some(true),
        },
    });
    p
}

async fn generate(w: &Client, p: &GenerateParams) -> GenerateResult {
    let (deltas, result) = within_for(LIMIT, w.generate(p).unwrap().collect())
        .await
        .unwrap();
    let streamed: String = deltas.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(streamed, result.text, "the deltas add up to the text");
    result
}

/// Every schema gives a complete output (`stop`, not `length`) that validates.
async fn every_schema_validates(w: &Client) {
    for (i, schema) in schemas().iter().enumerate() {
        let validator = jsonschema::validator_for(schema).unwrap();
        let r = generate(
            w,
            &with_schema("Answer with a short example as JSON.", schema),
        )
        .await;
        assert_eq!(
            r.finish_reason,
            FinishReason::Stop,
            "schema {i}: {:?}",
            r.text
        );
        let value: Value = serde_json::from_str(&r.text)
            .unwrap_or_else(|e| panic!("schema {i}: {:?} is not JSON: {e}", r.text));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "schema {i}: {value} is invalid: {errors:?}"
        );
    }
}

async fn load(w: &Client, model: &std::path::Path) {
    load_with(w, LoadParams::new(model_id(model))).await;
}

async fn load_with(w: &Client, params: LoadParams) {
    within_for(LIMIT, w.call::<Load>(&params)).await.unwrap();
}

#[tokio::test]
async fn smollm2_twenty_json_schemas_validate() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let w = worker(&[]);
    load(&w, &dir).await;
    every_schema_validates(&w).await;
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

#[tokio::test]
async fn gemma3_twenty_json_schemas_validate() {
    let Some(dir) = fixtures::gemma3_dir() else {
        return;
    };
    let w = worker(&[]);
    // The base model has no chat template: a question-and-answer one.
    let mut params = LoadParams::new(model_id(&dir));
    params.chat_template_override =
        Some("{% for m in messages %}Question: {{ m.content }}\n{% endfor %}Answer: ".into());
    load_with(&w, params).await;
    every_schema_validates(&w).await;
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// Regexes, a Lark grammar and a JSON object, sampled (seeded) rather than greedy, with
/// logprobs and a stop string: each output matches, and a seed repeats its output.
#[tokio::test]
async fn smollm2_regex_grammar_and_json_object_with_sampling() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let w = worker(&[]);
    load(&w, &dir).await;
    let sampled = |prompt: &str| {
        let mut p = greedy(prompt, 60);
        p.sampling.temperature = 0.9;
        p.sampling.seed = Some(11);
        p.logprobs = 2;
        p
    };

    let mut date = sampled("When did the Apollo 11 mission land?");
    date.regex = Some("[0-9]{4}-[0-9]{2}-[0-9]{2}".into());
    let a = generate(&w, &date).await;
    assert_eq!(a.finish_reason, FinishReason::Stop, "{:?}", a.text);
    let bytes = a.text.as_bytes();
    assert!(
        a.text.len() == 10
            && bytes[4] == b'-'
            && bytes[7] == b'-'
            && a.text.chars().filter(char::is_ascii_digit).count() == 8,
        "{:?}",
        a.text
    );
    let again = generate(&w, &date).await;
    assert_eq!(again.text, a.text, "same seed, same constrained output");

    let mut yes_no = sampled("Is the sky blue? Explain briefly.");
    yes_no.grammar = Some(
        "start: answer \", because \" reason \".\"\nanswer: \"Yes\" | \"No\"\nreason: /[a-z ]{1,40}/\n"
            .into(),
    );
    let r = generate(&w, &yes_no).await;
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let (answer, reason) = r
        .text
        .split_once(", because ")
        .expect("the grammar's shape");
    assert!(matches!(answer, "Yes" | "No"), "{:?}", r.text);
    let reason = reason.strip_suffix('.').expect("ends with a period");
    assert!(
        (1..=40).contains(&reason.len())
            && reason.chars().all(|c| c.is_ascii_lowercase() || c == ' '),
        "{:?}",
        r.text
    );

    // The same field takes GBNF (llama.cpp's format) when it holds `::=`.
    let mut gbnf = sampled("Name three colors.");
    gbnf.grammar = Some(
        "root ::= color (\", \" color){2}\ncolor ::= \"red\" | \"green\" | \"blue\" | \"yellow\"\n"
            .into(),
    );
    let r = generate(&w, &gbnf).await;
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let colors: Vec<&str> = r.text.split(", ").collect();
    assert!(
        colors.len() == 3
            && colors
                .iter()
                .all(|c| ["red", "green", "blue", "yellow"].contains(c)),
        "{:?}",
        r.text
    );

    let mut object = sampled("Describe a cat as JSON.");
    object.max_new_tokens = 120;
    object.sampling.temperature = 0.0;
    object.response_format = Some(ResponseFormat::JsonObject {});
    let r = generate(&w, &object).await;
    if r.finish_reason == FinishReason::Stop {
        let value: Value = serde_json::from_str(&r.text).unwrap();
        assert!(value.is_object(), "{value}");
    } else {
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert!(r.text.starts_with('{'), "{:?}", r.text);
    }

    // Cancelled after its first delta, a constrained generation answers with the text so far,
    // and the next request is served.
    let mut long = with_schema(
        "Write a long story as JSON.",
        &json!({"type": "object", "properties": {"story": {"type": "string", "minLength": 5000}},
            "required": ["story"]}),
    );
    long.max_new_tokens = 2000;
    let mut g = w.generate(&long).unwrap();
    let mut streamed = within_for(LIMIT, g.next_delta()).await.unwrap().text;
    assert!(within_for(LIMIT, w.cancel(g.id())).await.unwrap().cancelled);
    while let Some(delta) = within_for(LIMIT, g.next_delta()).await {
        streamed.push_str(&delta.text);
    }
    let r = within_for(LIMIT, g.finish()).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::Cancelled);
    assert_eq!(r.text, streamed);
    // Valid so far: a prefix of the schema's JSON (the cancel may land within the key).
    let head = "{\"story\": \"";
    assert!(
        r.text.starts_with(head) || head.starts_with(&r.text),
        "{:?}",
        r.text
    );

    // A stop string still cuts a constrained output (and is not emitted).
    let mut cut = greedy("Count from one to five in words.", 40);
    cut.regex = Some("one, two, three, four, five".into());
    cut.stop = vec![", three".into()];
    let r = generate(&w, &cut).await;
    assert_eq!(
        (r.finish_reason, r.text.as_str()),
        (FinishReason::StopSequence, "one, two")
    );
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// Speculative decoding under a constraint (prompt lookup: the prompt holds what to copy):
/// the same text as one token per pass, streamed whole, drafts taken, the output still valid
/// (a schema; a regex that refuses the commas the drafts offer; a Lark grammar).
#[tokio::test]
async fn speculative_decoding_under_constraints_answers_as_without() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let w = worker(&[]);
    load(&w, &dir).await;
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "born": {"type": "integer", "maximum": 3000}},
        "required": ["name", "born"],
        "additionalProperties": false
    });
    let json_ask = with_schema(
        r#"Repeat this JSON exactly: {"name": "Ada Lovelace", "born": 1815}"#,
        &schema,
    );
    let mut regex_ask = greedy(
        "Repeat exactly: the quick brown fox, the lazy dog, the quick brown fox, the lazy dog.",
        40,
    );
    regex_ask.regex = Some("[a-z ]{1,80}".into());
    let mut lark_ask = greedy("Repeat exactly: Yes, because the sky is blue.", 40);
    lark_ask.grammar = Some(
        "start: answer \", because \" reason \".\"\nanswer: \"Yes\" | \"No\"\nreason: /[a-z ]{1,40}/\n"
            .into(),
    );
    let mut outputs = Vec::new();
    for mut ask in [json_ask, regex_ask, lark_ask] {
        let plain = generate(&w, &ask).await;
        ask.speculative = Some(
            serde_json::from_value(json!({"method": "prompt_lookup", "num_draft_tokens": 4}))
                .unwrap(),
        );
        let fast = generate(&w, &ask).await;
        assert_eq!(fast.text, plain.text);
        assert_eq!(fast.finish_reason, FinishReason::Stop, "{:?}", fast.text);
        assert!(fast.usage.accepted_tokens > 0, "{:?}", fast.usage);
        outputs.push(fast.text);
    }
    let value: Value = serde_json::from_str(&outputs[0]).unwrap();
    assert!(jsonschema::is_valid(&schema, &value), "{value}");
    assert!(outputs[1]
        .chars()
        .all(|c| c.is_ascii_lowercase() || c == ' '));
    assert!(outputs[2].starts_with("Yes, because "), "{:?}", outputs[2]);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// A bad constraint is -32602 naming its field, before anything is generated; the worker and its
/// model keep serving; a field the worker does not know is refused, never ignored.
#[tokio::test]
async fn bad_constraints_and_unknown_fields_are_refused() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let w = worker(&[]);
    load(&w, &dir).await;
    let mut schema = with_schema("hi", &json!({"type": "frobnicate"}));
    schema.max_new_tokens = 5;
    let data = refused(&w, schema).await;
    assert_eq!(
        data["field"], "response_format.json_schema.schema",
        "{data}"
    );
    let mut regex = greedy("hi", 5);
    regex.regex = Some("(unclosed".into());
    assert_eq!(refused(&w, regex).await["field"], "regex");
    let mut grammar = greedy("hi", 5);
    grammar.grammar = Some("start: undefined_rule\n".into());
    assert_eq!(refused(&w, grammar).await["field"], "grammar");
    let mut two = greedy("hi", 5);
    two.regex = Some("a".into());
    two.grammar = Some("start: \"a\"\n".into());
    assert_eq!(refused(&w, two).await["field"], "grammar");

    let mut unknown = serde_json::to_value(greedy("hi", 5)).unwrap();
    unknown["n"] = json!(2);
    let e = rpc_error(
        within_for(LIMIT, w.generate_value(unknown).unwrap().collect()).await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(e.data.unwrap()["field"], "n");

    // Still serving, with the model resident.
    let r = generate(&w, &greedy("What is the capital of France?", 12)).await;
    assert!(r.text.contains("Paris"), "{:?}", r.text);
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// The `{field, reason}` of a generate refused with -32602 before any delta.
async fn refused(w: &Client, p: GenerateParams) -> Value {
    let mut handle = w.generate(&p).unwrap();
    let mut deltas = 0;
    while within_for(LIMIT, handle.next_delta()).await.is_some() {
        deltas += 1;
    }
    assert_eq!(deltas, 0, "nothing generated");
    rpc_error(handle.finish().await, ErrorCode::InvalidParams)
        .data
        .expect("{field, reason}")
}

/// Two tools with small, bounded arguments.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                "required": ["zone"], "additionalProperties": false}}}
    ])
}

/// Chat templates (ChatML, as SmolLM2's) teaching each family's tool-call syntax: what the
/// worker detects the syntax from.
const HERMES: &str = "{% if tools %}<|im_start|>system\nCall tools as <tool_call>\n{\"name\": name, \"arguments\": args}\n</tool_call>\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";
const LLAMA3: &str = "{% if tools %}<|im_start|>system\nRespond with a JSON object {\"name\": function name, \"parameters\": dictionary of arguments}. Tools: {{ tools | tojson }}<|eot_id|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";
const MISTRAL: &str = "{% if tools %}<|im_start|>system\n[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS] Call tools as [TOOL_CALLS][{\"name\": .., \"arguments\": ..}]<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";

fn with_tools(prompt: &str, choice: Value) -> Value {
    let mut p = serde_json::to_value(greedy(prompt, 100)).unwrap();
    p["tools"] = tools();
    p["tool_choice"] = choice;
    p
}

/// Every call names one of the tools (or `only`) and its arguments validate against that
/// tool's parameters schema.
fn check_calls(r: &GenerateResult, only: Option<&str>) {
    // Parallel calls may run out of tokens; every complete call still parses.
    assert!(
        matches!(
            r.finish_reason,
            FinishReason::ToolCalls | FinishReason::Length
        ),
        "{:?}",
        r.text
    );
    assert!(!r.tool_calls.is_empty(), "{:?}", r.text);
    for call in &r.tool_calls {
        assert!(call.id.starts_with("call_"), "{call:?}");
        let tool = tools()
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == call.function.name.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("unknown tool in {call:?}"));
        if let Some(only) = only {
            assert_eq!(call.function.name, only);
        }
        let arguments: Value = serde_json::from_str(&call.function.arguments).unwrap();
        let validator = jsonschema::validator_for(&tool["function"]["parameters"]).unwrap();
        assert!(validator.is_valid(&arguments), "{call:?}");
    }
}

async fn generate_value(w: &Client, p: Value) -> GenerateResult {
    within_for(LIMIT, w.generate_value(p).unwrap().finish())
        .await
        .unwrap()
}

/// `tool_choice: "required"` and a named function, in three families' syntaxes; `"auto"` parses
/// what the model wrote; `"none"` parses nothing.
#[tokio::test]
async fn smollm2_tool_calls_in_three_families_syntaxes() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let w = worker(&[]);
    let question = "What is the weather in Paris, and the time in Tokyo?";
    for (template, marker) in [
        (HERMES, "<tool_call>"),
        (LLAMA3, "{\"name\""),
        (MISTRAL, "[TOOL_CALLS]"),
    ] {
        let mut params = LoadParams::new(model_id(&dir));
        params.chat_template_override = Some(template.into());
        load_with(&w, params).await;
        // One call: a small model would otherwise go on calling until max_new_tokens.
        let mut one = with_tools(question, json!("required"));
        one["parallel_tool_calls"] = json!(false);
        let r = generate_value(&w, one).await;
        check_calls(&r, None);
        assert_eq!(r.tool_calls.len(), 1, "{:?}", r.text);
        assert!(r.text.trim_start().starts_with(marker), "{:?}", r.text);
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let mut named = with_tools(question, named);
        named["parallel_tool_calls"] = json!(false);
        let r = generate_value(&w, named).await;
        check_calls(&r, Some("get_time"));
    }

    // Hermes, `auto`: a call the output holds is parsed (a regex makes the model write one).
    let mut params = LoadParams::new(model_id(&dir));
    params.chat_template_override = Some(HERMES.into());
    load_with(&w, params).await;
    // Parallel calls (the default): every complete call parses and validates.
    let r = generate_value(&w, with_tools(question, json!("required"))).await;
    check_calls(&r, None);
    let call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"Asia/Tokyo\"}}\n</tool_call>";
    let mut auto = with_tools(question, json!("auto"));
    auto["regex"] = json!(regex_escape(call));
    let r = generate_value(&w, auto.clone()).await;
    assert_eq!(r.text, call);
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].function.name, "get_time");
    assert_eq!(
        serde_json::from_str::<Value>(&r.tool_calls[0].function.arguments).unwrap(),
        json!({"zone": "Asia/Tokyo"})
    );
    auto["tool_choice"] = json!("none");
    let r = generate_value(&w, auto).await;
    assert_eq!((r.text.as_str(), r.tool_calls.len()), (call, 0));
    assert_eq!(r.finish_reason, FinishReason::Stop);

    // Without a syntax in the template, a forced call says what to do.
    load(&w, &dir).await;
    let e = rpc_error(
        within_for(
            LIMIT,
            w.generate_value(with_tools(question, json!("required")))
                .unwrap()
                .finish(),
        )
        .await,
        ErrorCode::InvalidParams,
    );
    assert_eq!(e.data.unwrap()["field"], "tool_choice");
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// `text` as a regex matching exactly itself.
fn regex_escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                format!("\\{c}")
            }
            '\n' => "\\n".into(),
            c => c.to_string(),
        })
        .collect()
}

/// SmolLM2 with two unused added tokens renamed `<think>` and `</think>` (ids 11 and 12, no
/// longer special): a real model whose vocabulary has reasoning markup.
fn smollm2_with_think_tokens(dir: &std::path::Path) -> tempfile::TempDir {
    with_renamed_tokens(dir, &[(11, "<think>"), (12, "</think>")], false, None)
}

/// A copy of the model in `dir` (weights linked) whose tokenizer has its added tokens renamed
/// (`fixtures::rename_added_tokens`), with `eos` its end-of-sequence ids when given.
fn with_renamed_tokens(
    dir: &std::path::Path,
    renames: &[(usize, &str)],
    special: bool,
    eos: Option<&[u32]>,
) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    for file in [
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(dir.join(file), out.path().join(file)).unwrap();
    }
    std::os::unix::fs::symlink(
        dir.join("model.safetensors"),
        out.path().join("model.safetensors"),
    )
    .unwrap();
    let mut tokenizer: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    fixtures::rename_added_tokens(&mut tokenizer, renames, special);
    std::fs::write(
        out.path().join("tokenizer.json"),
        serde_json::to_vec(&tokenizer).unwrap(),
    )
    .unwrap();
    if let Some(eos) = eos {
        let config = json!({"eos_token_id": eos});
        std::fs::write(
            out.path().join("generation_config.json"),
            config.to_string(),
        )
        .unwrap();
    }
    out
}

/// ChatML whose generation prompt opens a thought, as templates with thinking on do.
const THINKING: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n";

/// A reasoning model's deltas carry their channel; a schema constrains only the answer after
/// the thought. (A logit bias on `</think>` makes the 135M model, which never learnt these
/// tokens, close its thought at once.)
#[tokio::test]
async fn reasoning_is_its_own_channel_and_a_schema_constrains_the_answer() {
    let Some(dir) = fixtures::smollm2_dir() else {
        return;
    };
    let model = smollm2_with_think_tokens(&dir);
    let w = worker(&[]);
    let mut params = LoadParams::new(model_id(model.path()));
    params.chat_template_override = Some(THINKING.into());
    load_with(&w, params).await;

    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"], "additionalProperties": false});
    let mut p = with_schema(
        "Which city is the capital of France? Answer as JSON.",
        &schema,
    );
    p.sampling.logit_bias = [("12".to_string(), 100.0)].into();
    let (deltas, r) = within_for(LIMIT, w.generate(&p).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let (thought, answer) = r.text.split_once("</think>").expect("the thought closes");
    assert_eq!(thought, "", "the bias closed the thought at once");
    let value: Value = serde_json::from_str(answer.trim_start()).unwrap();
    assert!(
        jsonschema::validator_for(&schema).unwrap().is_valid(&value),
        "{value}"
    );
    // The closing tag is reasoning; everything after it is content.
    let channels: Vec<_> = deltas
        .iter()
        .map(|d| (d.channel, d.text.as_str()))
        .collect();
    assert_eq!(
        channels[0],
        (Some(Channel::Reasoning), "</think>"),
        "{channels:?}"
    );
    assert!(
        channels[1..]
            .iter()
            .all(|(c, _)| *c == Some(Channel::Content)),
        "{channels:?}"
    );

    // Unconstrained, the same: the channel follows the markup token by token.
    let mut free = greedy("Hello", 3);
    free.sampling.logit_bias = [("12".to_string(), 100.0)].into();
    let (deltas, _) = within_for(LIMIT, w.generate(&free).unwrap().collect())
        .await
        .unwrap();
    let channels: Vec<_> = deltas.iter().map(|d| d.channel).collect();
    assert_eq!(
        channels,
        [
            Some(Channel::Reasoning),
            Some(Channel::Content),
            Some(Channel::Content)
        ],
        "{deltas:?}"
    );

    // A model without the markup sends no channel.
    load(&w, &dir).await;
    let (deltas, _) = within_for(LIMIT, w.generate(&greedy("Hello", 3)).unwrap().collect())
        .await
        .unwrap();
    assert!(deltas.iter().all(|d| d.channel.is_none()), "{deltas:?}");
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

/// A harmony chat template, as gpt-oss's writes its prompt: tools in the developer message,
/// assistant turns on the final channel, the generation prompt `<|start|>assistant`.
const HARMONY: &str = "<|start|>system<|message|>Reasoning: low\n\n# Valid channels: analysis, commentary, final.<|end|>{% if tools %}<|start|>developer<|message|># Tools\n\n{{ tools | tojson }}<|end|>{% endif %}{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant";

/// The token `<|end|>` of `fixtures::HARMONY_TOKENS`, and SmolLM2's tokens `analysis`, `final`.
const HARMONY_END: u32 = 4;
const ANALYSIS: u32 = 14975;
const FINAL: u32 = 17254;

/// Reasoning deltas, then content deltas, never mixed: (reasoning, content).
fn channels(deltas: &[protocol::methods::GenerateDelta]) -> (String, String) {
    let first_content = deltas
        .iter()
        .position(|d| d.channel == Some(Channel::Content))
        .unwrap_or(deltas.len());
    let (reasoning, content) = deltas.split_at(first_content);
    assert!(
        reasoning
            .iter()
            .all(|d| d.channel == Some(Channel::Reasoning))
            && content.iter().all(|d| d.channel == Some(Channel::Content)),
        "{deltas:?}"
    );
    let text =
        |ds: &[protocol::methods::GenerateDelta]| ds.iter().map(|d| d.text.clone()).collect();
    (text(reasoning), text(content))
}

/// gpt-oss (a tiny random one) with harmony's marker tokens: forced tool calls are written in
/// harmony and parsed, arguments valid per schema; a schema holds only the final message; the
/// analysis streams as reasoning, the rest as content, the markers and headers in neither.
/// (Logit biases on `analysis` and `<|end|>` make the random model open an analysis and end
/// it; the split of every kind of message is in `crates/constrain/src/harmony_tests.rs`.)
#[tokio::test]
async fn gpt_oss_harmony_tool_calls_channels_and_final_only_schema() {
    let Some(dir) = fixtures::vision_fixture("tiny-gpt-oss") else {
        return;
    };
    let model = with_renamed_tokens(&dir, &fixtures::HARMONY_TOKENS, true, Some(&[8, 9, 2]));
    let w = worker(&[]);
    let mut params = LoadParams::new(model_id(model.path()));
    params.chat_template_override = Some(HARMONY.into());
    load_with(&w, params).await;
    // `<|end|>` and the token `analysis` biased: the model opens an analysis and ends it.
    let bias = json!({HARMONY_END.to_string(): BIAS, ANALYSIS.to_string(): BIAS});
    let question = "What is the weather in Paris, and the time in Tokyo?";

    for (choice, only) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            Some("get_time"),
        ),
    ] {
        let mut p = with_tools(question, choice);
        p["logit_bias"] = bias.clone();
        p["max_new_tokens"] = json!(200);
        let (deltas, r) = within_for(LIMIT, w.generate_value(p).unwrap().collect())
            .await
            .unwrap();
        check_calls(&r, only);
        assert_eq!(r.finish_reason, FinishReason::ToolCalls, "{:?}", r.text);
        assert_eq!(r.tool_calls.len(), 1, "one call per harmony turn");
        let (reasoning, content) = channels(&deltas);
        assert!(!reasoning.is_empty(), "the analysis streamed as reasoning");
        assert_eq!(format!("{reasoning}{content}"), r.text);
        // The content is the call's arguments alone: its name is in the header, never shown.
        let arguments: Value = serde_json::from_str(&content).unwrap();
        assert_eq!(
            arguments,
            serde_json::from_str::<Value>(&r.tool_calls[0].function.arguments).unwrap()
        );
        assert!(!r.text.contains("functions."), "{:?}", r.text);
    }

    let schema = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days"], "additionalProperties": false});
    let mut p = with_schema("Which city, for how many days? Answer as JSON.", &schema);
    p.sampling.logit_bias = [
        (HARMONY_END.to_string(), BIAS),
        (ANALYSIS.to_string(), BIAS),
    ]
    .into();
    let (deltas, r) = within_for(LIMIT, w.generate(&p).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let (reasoning, content) = channels(&deltas);
    assert!(!reasoning.is_empty(), "the analysis streamed as reasoning");
    assert_eq!(format!("{reasoning}{content}"), r.text);
    let value: Value = serde_json::from_str(&content).unwrap();
    assert!(
        jsonschema::validator_for(&schema).unwrap().is_valid(&value),
        "{value}"
    );
    assert!(r.tool_calls.is_empty());

    // A generation prompt that opens the analysis itself: the output starts inside it, ends it
    // (`<|end|>`, the bias makes the thought empty) and the schema holds the final message.
    let mut params = LoadParams::new(model_id(model.path()));
    params.chat_template_override = Some(format!("{HARMONY}<|channel|>analysis<|message|>"));
    params.force = true;
    load_with(&w, params).await;
    p.sampling.logit_bias = [(HARMONY_END.to_string(), BIAS), (FINAL.to_string(), BIAS)].into();
    let (deltas, r) = within_for(LIMIT, w.generate(&p).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    // Six tokens of structure came before the answer: `<|end|>`, `<|start|>` `assistant`,
    // `<|channel|>` `final` `<|message|>` (from a header, as the grammar would have read the
    // opened analysis without it, three).
    assert!(
        r.usage.completion_tokens as usize >= deltas.len() + 6,
        "{:?} {deltas:?}",
        r.usage
    );
    let (_, content) = channels(&deltas);
    let value: Value = serde_json::from_str(&content).unwrap();
    assert!(jsonschema::is_valid(&schema, &value), "{value}");
    within_for(LIMIT, w.shutdown()).await.unwrap();
}

const BIAS: f64 = 100.0;
