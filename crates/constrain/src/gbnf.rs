//! GBNF (llama.cpp's grammar format) rewritten as llguidance's Lark: llguidance reads Lark only.
//! Written here because no crate converts between them; the two differ in surface syntax only
//! (`::=` vs `:`, `[...]` a character class vs an optional, rule names with `-`, `root` vs
//! `start`, rules over several lines), not in what they can express.

use std::fmt::Write;

/// The Lark grammar of a GBNF one, or what is wrong with it.
pub(crate) fn to_lark(gbnf: &str) -> Result<String, String> {
    let tokens = lex(gbnf)?;
    let mut lark = String::new();
    let mut defined = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let (Tok::Name(name), Some(Tok::Define)) = (&tokens[i], tokens.get(i + 1)) else {
            return Err(format!("expected `name ::=` at {:?}", tokens[i]));
        };
        let rule = rule_name(name);
        if defined.contains(&rule) {
            return Err(format!("rule {name} is defined twice"));
        }
        write!(lark, "{rule}:").unwrap();
        i += 2;
        let start = i;
        // A rule runs to the next `name ::=`.
        while i < tokens.len()
            && !matches!(
                (&tokens[i], tokens.get(i + 1)),
                (Tok::Name(_), Some(Tok::Define))
            )
        {
            if tokens[i] == Tok::Define {
                return Err(format!(
                    "`::=` in rule {name} must follow a rule name (`name ::= ...`)"
                ));
            }
            lark.push(' ');
            lark.push_str(&tokens[i].lark());
            i += 1;
        }
        if i == start {
            return Err(format!("rule {name} is empty"));
        }
        lark.push('\n');
        defined.push(rule);
    }
    if !defined.iter().any(|r| r == "start") {
        return Err("no `root` rule".into());
    }
    Ok(lark)
}

/// GBNF's `root` is Lark's `start`; other names lowercased (Lark's uppercase names are
/// terminals), `-` made `_`, and prefixed so none can be `start`.
fn rule_name(name: &str) -> String {
    if name == "root" {
        "start".into()
    } else {
        format!("r_{}", name.to_lowercase().replace('-', "_"))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// A literal's text (escapes resolved).
    Literal(String),
    /// A character class as written, brackets included.
    Class(String),
    Any,
    /// `|`, `(`, `)`, `*`, `+`, `?`, or a `{m,n}` repetition, as written.
    Punct(String),
}

impl Tok {
    fn lark(&self) -> String {
        match self {
            Tok::Name(n) => rule_name(n),
            Tok::Define => unreachable!("`to_lark` refuses a `::=` inside a rule"),
            Tok::Literal(text) => serde_json::Value::from(text.as_str()).to_string(),
            Tok::Class(class) => format!("/{}/", class.replace('/', "\\/")),
            Tok::Any => "/(.|\\n)/".into(),
            Tok::Punct(p) => p.clone(),
        }
    }
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                tokens.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let (text, end) = literal(&chars, i + 1)?;
                tokens.push(Tok::Literal(text));
                i = end;
            }
            '[' => {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != ']' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                if i >= chars.len() {
                    return Err("a character class `[` is not closed".into());
                }
                i += 1;
                tokens.push(Tok::Class(chars[start..i].iter().collect()));
            }
            '{' => {
                let start = i;
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                if i >= chars.len() {
                    return Err("a repetition `{` is not closed".into());
                }
                i += 1;
                let rep: String = chars[start..i]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                tokens.push(Tok::Punct(rep));
            }
            '.' => {
                tokens.push(Tok::Any);
                i += 1;
            }
            '|' | '(' | ')' | '*' | '+' | '?' => {
                tokens.push(Tok::Punct(c.to_string()));
                i += 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '_')
                {
                    i += 1;
                }
                tokens.push(Tok::Name(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected {other:?} in the grammar")),
        }
    }
    Ok(tokens)
}

/// A `"..."` literal from `start` (after the quote): its text and the index after it.
fn literal(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let mut text = String::new();
    let mut i = start;
    loop {
        match chars.get(i) {
            None => return Err("a string literal is not closed".into()),
            Some('"') => return Ok((text, i + 1)),
            Some('\\') => {
                let (c, len) = escape(&chars[i + 1..])?;
                text.push(c);
                i += 1 + len;
            }
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

/// The character of an escape (after its backslash) and how many chars it took.
fn escape(rest: &[char]) -> Result<(char, usize), String> {
    let hex = |n: usize| -> Result<(char, usize), String> {
        let digits: String = rest
            .get(1..=n)
            .ok_or("a short \\x/\\u escape")?
            .iter()
            .collect();
        let code =
            u32::from_str_radix(&digits, 16).map_err(|_| format!("bad escape {digits:?}"))?;
        Ok((
            char::from_u32(code).ok_or("an escape that is no character")?,
            n + 1,
        ))
    };
    match rest.first() {
        Some('n') => Ok(('\n', 1)),
        Some('r') => Ok(('\r', 1)),
        Some('t') => Ok(('\t', 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c) => Ok((c, 1)),
        None => Err("a string ends in a backslash".into()),
    }
}
