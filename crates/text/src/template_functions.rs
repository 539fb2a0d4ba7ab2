//! The functions and filters HF transformers adds to its Jinja environment for chat
//! templates, rebuilt for minijinja: `raise_exception`, `strftime_now` and a `tojson` that
//! writes what Python's `json.dumps` writes.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The message a template passed to `raise_exception`, carried as the source of the render
/// error so that it can be told apart from other template errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RaisedException(pub(crate) String);

/// `raise_exception(msg)`: the template refuses the conversation (wrong role order, ...).
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        "the chat template raised an exception",
    )
    .with_source(RaisedException(message)))
}

/// `strftime_now(fmt)`: the local time formatted with a C `strftime` format (Llama 3.1 puts
/// today's date into its system prompt this way).
pub(crate) fn strftime_now(format: String) -> Result<Value, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format string {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// `value|tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, the
/// signature and output of HF transformers' filter (Python `json.dumps`). minijinja's own
/// `tojson` escapes HTML characters and uses compact separators, which changes prompts.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_owned()),
        Some(v) => Some(" ".repeat(usize::try_from(v)?)),
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair (item_separator, key_separator)",
            ))
        }
        // Python's defaults: no spaces before newlines when indenting.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut writer = PyJsonWriter {
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    writer.write(value, 0)?;
    Ok(Value::from(writer.out))
}

struct PyJsonWriter {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJsonWriter {
    fn write(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.write_number(value),
            ValueKind::String => self.write_string(value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                let mut entries = Vec::with_capacity(keys.len());
                for key in keys {
                    let item = value.get_item(&key)?;
                    entries.push((key, item));
                }
                self.write_container(('{', '}'), entries.len(), depth, |w, i, depth| {
                    let (key, item) = &entries[i];
                    match key.as_str() {
                        Some(s) => w.write_string(s),
                        None => w.write_string(&key.to_string()),
                    }
                    w.out.push_str(&w.key_sep.clone());
                    w.write(item, depth)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(('[', ']'), items.len(), depth, |w, i, depth| {
                    w.write(&items[i], depth)
                })?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {} value is not JSON serializable", value.kind()),
                ))
            }
        }
        Ok(())
    }

    fn write_container(
        &mut self,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        let item_sep = self.item_sep.clone();
        for i in 0..len {
            if i > 0 {
                self.out.push_str(&item_sep);
            }
            self.newline(depth + 1);
            item(self, i, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn write_number(&mut self, value: &Value) {
        if value.is_integer() {
            self.out.push_str(&value.to_string());
        } else {
            self.out.push_str(&python_float_repr(
                f64::try_from(value.clone()).unwrap_or(f64::NAN),
            ));
        }
    }

    fn write_string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional notation for
/// exponents in -4..16, otherwise `1e-05` / `1.5e+16`, and always a `.0` on whole numbers.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-tripping digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` writes an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{text}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::python_float_repr;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, expected) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.0, "0.0"),
        ] {
            assert_eq!(python_float_repr(f), expected, "{f}");
        }
    }
}
