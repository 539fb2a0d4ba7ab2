//! The oracle: what the contract says each line must get.

use super::*;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Expect {
    /// No response (blank line, notification, response-shaped message).
    Nothing,
    /// An error with id null and this code.
    NullError(i64),
    /// Exactly one response with this id; `None` method: a -32600 error.
    Answer(RequestId, Option<String>),
}

pub(super) fn expect(line: &[u8]) -> Expect {
    if line.len() > MAX_LINE_BYTES {
        return match leading_id(line) {
            Some(id) => Expect::Answer(id, None),
            None => Expect::NullError(-32600),
        };
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Expect::Nothing;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return Expect::NullError(-32700);
    };
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Expect::NullError(-32700);
    };
    let Value::Object(mut obj) = value else {
        return Expect::NullError(-32600);
    };
    let id = match obj.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(RequestId::String(s)),
        Some(Value::Number(n)) if n.as_i64().is_some() => {
            Some(RequestId::Number(n.as_i64().unwrap()))
        }
        Some(_) => return Expect::NullError(-32600),
    };
    let invalid = |id: Option<RequestId>| match id {
        Some(id) => Expect::Answer(id, None),
        None => Expect::NullError(-32600),
    };
    if obj.get("jsonrpc").is_some_and(|v| v != "2.0") {
        return invalid(id);
    }
    if !matches!(
        obj.get("params"),
        None | Some(Value::Null | Value::Object(_) | Value::Array(_))
    ) {
        return invalid(id);
    }
    match obj.remove("method") {
        Some(Value::String(method)) => match id {
            Some(id) => Expect::Answer(id, Some(method)),
            None => Expect::Nothing,
        },
        Some(_) => invalid(id),
        None => match (obj.remove("result"), obj.remove("error")) {
            // A response: the worker sends no requests and ignores it.
            (Some(_), None) if id.is_some() => Expect::Nothing,
            (None, Some(e)) if serde_json::from_value::<ResponseError>(e.clone()).is_ok() => {
                Expect::Nothing
            }
            _ => invalid(id),
        },
    }
}

/// Error codes a request to `method` may get (besides a result).
/// The contract: an over-long line's error carries the request's id when the line's first 4 KiB
/// hold it as a key of the top-level object ahead of anything cut off there. The generator
/// writes compact JSON, so that is when the compact text of the keys up to `id` starts the line
/// within 4 KiB.
fn leading_id(line: &[u8]) -> Option<RequestId> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    let mut prefix = String::from("{");
    for (i, (key, value)) in obj.iter().enumerate() {
        if i > 0 {
            prefix.push(',');
        }
        prefix += &format!("{}:{value}", Value::from(key.as_str()));
        if key == "id" {
            let held = line.starts_with(prefix.as_bytes()) && prefix.len() <= 4096;
            return held.then(|| serde_json::from_value(value.clone()).ok())?;
        }
    }
    None
}

pub(super) fn allowed_codes(method: &str) -> &'static [i64] {
    match method {
        Initialize::NAME | Status::NAME | Cancel::NAME => &[-32602],
        Tokenize::NAME => &[-32602, -32001],
        Load::NAME => &[-32602, -32002, -32003, -32800],
        Generate::NAME => &[-32602, -32001, -32003, -32004, -32005],
        Unload::NAME => &[-32602, -32001, -32003, -32800],
        Reset::NAME => &[-32602, -32003, -32800],
        _ => &[-32601],
    }
}

/// Whether `response` is a plausible answer to a request to `method` (`None`: an invalid request).
pub(super) fn check_answer(method: Option<&str>, response: &Response) -> Result<(), String> {
    let Some(method) = method else {
        return match &response.outcome {
            Err(e) if e.code == -32600 => Ok(()),
            other => Err(format!("expected -32600, got {other:?}")),
        };
    };
    let value = match &response.outcome {
        Err(e) => {
            return if allowed_codes(method).contains(&e.code) {
                Ok(())
            } else {
                Err(format!(
                    "`{method}` answered with error {} ({})",
                    e.code, e.message
                ))
            };
        }
        Ok(v) => v.clone(),
    };
    pub(super) fn shape<M: Method>(v: Value) -> Result<(), String> {
        serde_json::from_value::<M::Result>(v)
            .map(|_| ())
            .map_err(|e| format!("`{}` result has the wrong shape: {e}", M::NAME))
    }
    match method {
        Initialize::NAME => shape::<Initialize>(value),
        Status::NAME => shape::<Status>(value),
        Cancel::NAME => shape::<Cancel>(value),
        Tokenize::NAME => {
            let r: <Tokenize as Method>::Result =
                serde_json::from_value(value).map_err(|e| format!("tokenize result: {e}"))?;
            if r.count != r.tokens.len() {
                return Err(format!(
                    "tokenize count {} != {} tokens",
                    r.count,
                    r.tokens.len()
                ));
            }
            Ok(())
        }
        Load::NAME => shape::<Load>(value),
        Generate::NAME => {
            let r: GenerateResult =
                serde_json::from_value(value).map_err(|e| format!("generate result: {e}"))?;
            if r.usage.total_tokens != r.usage.prompt_tokens + r.usage.completion_tokens {
                return Err(format!("generate usage does not add up: {:?}", r.usage));
            }
            Ok(())
        }
        Unload::NAME => shape::<Unload>(value),
        Reset::NAME => shape::<Reset>(value),
        other => Err(format!("unknown method `{other}` answered with a result")),
    }
}

/// Pairs each request with one answer that fits it (`order[i]` answers `requests[i]`); ids are
/// reused rarely, so a plain search over permutations is enough.
pub(super) fn assign(requests: &[Pending], answers: &[Response]) -> Option<Vec<usize>> {
    pub(super) fn search(
        requests: &[Pending],
        answers: &[Response],
        used: &mut Vec<bool>,
        order: &mut Vec<usize>,
    ) -> bool {
        let Some(p) = requests.get(order.len()) else {
            return true;
        };
        for (i, r) in answers.iter().enumerate() {
            if !used[i] && check_answer(p.method.as_deref(), r).is_ok() {
                used[i] = true;
                order.push(i);
                if search(requests, answers, used, order) {
                    return true;
                }
                order.pop();
                used[i] = false;
            }
        }
        false
    }
    let mut order = Vec::new();
    search(
        requests,
        answers,
        &mut vec![false; answers.len()],
        &mut order,
    )
    .then_some(order)
}
