//! Where an image comes from: the strings the protocol accepts (raw base64, a `data:` URL, a local
//! path or `file://` URL), read into bytes. Nothing here touches the network.

use std::path::PathBuf;

use base64::Engine as _;

use crate::error::{ImageError, Result};

/// A parsed image string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Bytes carried in the string itself (raw base64 or a `data:` URL), decoded.
    Inline(Vec<u8>),
    /// A local file (a plain path or a `file://` URL).
    File(PathBuf),
}

impl ImageSource {
    /// Parses an image string. In order: `data:` URL; `file://` URL; another `scheme://` is
    /// refused (http(s) included: the worker fetches nothing); an existing file; base64.
    /// A string that is neither an existing file nor valid base64 is reported as a missing
    /// file when it looks like a path (has `/`, `.`, `\`, `~` or `:`), else as bad base64.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ImageError::Empty);
        }
        if let Some(rest) = strip_prefix_ignore_case(s, "data:") {
            let (meta, data) = rest.split_once(',').ok_or(ImageError::DataUrlNotBase64)?;
            if !meta.to_ascii_lowercase().ends_with(";base64") {
                return Err(ImageError::DataUrlNotBase64);
            }
            return decode_base64(data).map(ImageSource::Inline);
        }
        if let Some(rest) = strip_prefix_ignore_case(s, "file://") {
            // file:///abs/path (empty host) or file://localhost/abs/path.
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            return Ok(ImageSource::File(PathBuf::from(percent_decode(path))));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            {
                return Err(ImageError::UnsupportedSource { shown: shorten(s) });
            }
        }
        let path = PathBuf::from(s);
        if path.is_file() {
            return Ok(ImageSource::File(path));
        }
        match decode_base64(s) {
            Ok(bytes) => Ok(ImageSource::Inline(bytes)),
            // Not base64 and shaped like a path: say the file is missing.
            Err(_) if looks_like_path(s) => Err(ImageError::File {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            }),
            Err(err) => Err(err),
        }
    }

    /// The image's bytes.
    pub fn read(&self) -> Result<Vec<u8>> {
        match self {
            ImageSource::Inline(bytes) => Ok(bytes.clone()),
            ImageSource::File(path) => std::fs::read(path).map_err(|source| ImageError::File {
                path: path.clone(),
                source,
            }),
        }
    }

    /// The image's bytes, without copying inline data.
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        match self {
            ImageSource::Inline(bytes) => Ok(bytes),
            file => file.read(),
        }
    }
}

/// Standard base64, padded or not, with whitespace (line breaks) ignored.
fn decode_base64(data: &str) -> Result<Vec<u8>> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine
        .decode(compact.as_bytes())
        .map_err(|e| ImageError::BadBase64 {
            reason: e.to_string(),
        })?;
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    Ok(bytes)
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

/// `%20` and friends in `file://` URLs.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Characters base64 never has (`.`, `\\`, `~`, `:`) or a `/` in a string that is not base64.
fn looks_like_path(s: &str) -> bool {
    s.contains(['/', '.', '\\', '~', ':'])
}

/// The start of a long string, for error messages (a data URL can be megabytes).
fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}
