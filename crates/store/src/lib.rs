//! Where a model's files are, on disk: a local directory, a Hugging Face repo id (found in the
//! hub cache that Python tools share, or downloaded; [`hub`]), or a `.gguf` file (imported once
//! into our cache as a Hugging Face-layout directory; [`gguf_import`]). No MLX: the engine loads
//! the directory this finds.

mod error;
pub mod gguf_import;
mod hub;
mod progress;

use std::path::{Path, PathBuf};

pub use error::{Error, LoadErrorKind};
pub use hub::is_repo_id;
pub use progress::{LoadProgress, LoadStage};

/// What to find: `model` is a directory, a `.gguf` file or a repo id (`org/name`).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub model: &'a str,
    /// Hub revision (branch, tag or commit); `None` means "main".
    pub revision: Option<&'a str>,
    /// Hub token for gated or private repos (else `HF_TOKEN`, else the token file).
    pub hf_token: Option<&'a HfToken>,
}

/// A local directory, or a hub repo id's snapshot (cached or downloaded). `.gguf` files go
/// through [`gguf_import::imported_dir`] instead. `cancelled` is polled between downloads.
pub fn resolve(
    source: &Source,
    progress: &mut dyn FnMut(LoadProgress),
    cancelled: &dyn Fn() -> bool,
) -> Result<PathBuf, Error> {
    let model = source.model;
    let path = Path::new(model);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.exists() {
        return Err(Error::load(
            LoadErrorKind::NotFound,
            format!(
                "`{model}` is a file; give a model directory (config.json, *.safetensors, \
                 tokenizer.json) or a .gguf file"
            ),
        ));
    }
    if is_repo_id(model) {
        return hub::resolve(source, progress, cancelled);
    }
    Err(Error::load(
        LoadErrorKind::NotFound,
        format!("no model directory at `{model}`, and it is not a Hugging Face repo id (org/name)"),
    ))
}

/// Our cache: `MLX_WORKER_CACHE`, else `<user cache>/mlx-worker` (`XDG_CACHE_HOME` or
/// `~/.cache`, [`pypi::user_cache_dir`]). GGUF imports live below it.
pub fn cache_root() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("MLX_WORKER_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    pypi::user_cache_dir()
        .map(|c| c.join("mlx-worker"))
        .map_err(|e| {
            Error::load(
                LoadErrorKind::NotFound,
                format!("{e} (or MLX_WORKER_CACHE)"),
            )
        })
}

/// A Hugging Face token. `Debug` prints `<redacted>`; only the hub client reads it, through
/// [`HfToken::expose`]. Never logged, echoed or put into the environment; zeroed when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct HfToken(String);

impl HfToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token itself, for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for HfToken {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for HfToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HfToken(<redacted>)")
    }
}
