//! The crate's one error type: each variant names the problem and what to do about it.

use std::path::PathBuf;

/// What can go wrong between an image string and pixel values.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The string is none of the accepted sources.
    #[error(
        "unsupported image source {shown:?}: give base64 image data, a data URL \
         (data:image/png;base64,...), a local file path or a file:// URL \
         (http(s) URLs are not fetched)"
    )]
    UnsupportedSource { shown: String },
    /// A data URL or raw string that is not valid base64.
    #[error("image data is not valid base64 ({reason}): send the file's bytes base64-encoded")]
    BadBase64 { reason: String },
    /// A `data:` URL without `;base64,`.
    #[error("data URL is not base64-encoded: use data:image/<type>;base64,<data>")]
    DataUrlNotBase64,
    /// The empty string, or base64 of nothing.
    #[error("image data is empty")]
    Empty,
    /// A local file that cannot be read.
    #[error("cannot read image file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes of no format we decode.
    #[error("unsupported image format{}: PNG, JPEG, WebP and GIF are accepted", match found { Some(f) => format!(" ({f})"), None => String::new() })]
    UnsupportedFormat { found: Option<String> },
    /// More pixels than the cap; refused before decoding (a decompression bomb, or just too big).
    #[error(
        "image is {width}x{height} = {pixels} pixels, more than the limit of {max} pixels: \
         send a smaller image"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        max: u64,
    },
    /// Damaged or truncated data.
    #[error("cannot decode {format} image: {reason}")]
    Decode { format: String, reason: String },
    /// A pixel layout we do not convert to RGB (none of the four formats should produce one).
    #[error("unsupported pixel layout {0}")]
    UnsupportedColor(String),
    /// A processor file that cannot be read or parsed.
    #[error("cannot read {}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// A processor setting with a value we do not handle, or an option we do not implement.
    #[error("image processor setting `{field}`: {reason}")]
    Unsupported { field: String, reason: String },
    /// The image does not fit the processor (e.g. Qwen's 200:1 aspect-ratio limit).
    #[error("image of {width}x{height} cannot be processed: {reason}")]
    BadImageSize {
        width: u32,
        height: u32,
        reason: String,
    },
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;
