//! JSON as Python's `json` module writes it: besides JSON, the non-finite floats it writes bare
//! (`Infinity`, `-Infinity`, `NaN`), which transformers puts into some config.json files
//! (Nemotron-H's `time_step_limit`). JSON has no number for them, so they are read as strings
//! and [`python_float`] reads them back. serde_json has no option for them; the quoting is a
//! small scan that leaves strings alone.

use std::borrow::Cow;

use serde_json::Value;

/// Parses `text` as JSON, Python's bare non-finite floats allowed ([`quote_python_constants`]).
pub fn parse_python_json(text: &str) -> serde_json::Result<Value> {
    serde_json::from_str(&quote_python_constants(text))
}

/// A number config.json holds as Python's `json` writes it: a JSON number, or one of the
/// non-finite values it writes bare (`Infinity`, `-Infinity`, `NaN`), which
/// [`quote_python_constants`] turned into strings.
pub fn python_float(value: &Value) -> Option<f64> {
    match value {
        Value::String(s) if s == "Infinity" => Some(f64::INFINITY),
        Value::String(s) if s == "-Infinity" => Some(f64::NEG_INFINITY),
        Value::String(s) if s == "NaN" => Some(f64::NAN),
        other => other.as_f64(),
    }
}

/// config.json as Python's `json` writes it, with the non-finite floats it writes bare
/// (`Infinity`, `-Infinity`, `NaN`: transformers' Nemotron-H `time_step_limit`), which JSON has
/// no number for, quoted as strings, so that it parses ([`python_float`] reads them back).
/// Nothing inside strings changes.
pub fn quote_python_constants(text: &str) -> Cow<'_, str> {
    const BARE: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    if !BARE.iter().any(|b| text.contains(b)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if !in_string {
            if let Some(b) = BARE.iter().find(|b| rest.starts_with(**b)) {
                out.push('"');
                out.push_str(b);
                out.push('"');
                rest = &rest[b.len()..];
                continue;
            }
        }
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            _ => {}
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_non_finite_floats_become_strings_and_read_back() {
        let text =
            r#"{"limit": [0.0, Infinity], "low": -Infinity, "x": NaN, "s": "Infinity \" NaN"}"#;
        let v = parse_python_json(text).unwrap();
        let limit: Vec<f64> = v["limit"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(python_float)
            .collect();
        assert_eq!(limit, vec![0.0, f64::INFINITY]);
        assert_eq!(python_float(&v["low"]), Some(f64::NEG_INFINITY));
        assert!(python_float(&v["x"]).unwrap().is_nan());
        // Inside strings nothing changes.
        assert_eq!(v["s"], "Infinity \" NaN");
        assert_eq!(quote_python_constants(r#"{"a": 1}"#), r#"{"a": 1}"#);
    }
}
