//! Hugging Face repo ids (`org/name`): found in the hub cache that Python tools share
//! (`models--org--name/{refs,blobs,snapshots}`), downloaded with `hf-hub` when missing.
//!
//! Cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
//! `~/.cache/huggingface/hub`. Endpoint: `HF_ENDPOINT` (default `https://huggingface.co`).
//! `HF_HUB_OFFLINE=1`: the cache only. Token: the request's `hf_token`, else `HF_TOKEN`, else the
//! token file (`HF_TOKEN_PATH`, else `HF_HOME/token`); it goes to the HTTP client and nowhere else.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use hf_hub::{
    api::{
        sync::{ApiBuilder, ApiError},
        Progress,
    },
    Cache, Repo, RepoType,
};

use crate::{Error, LoadErrorKind, LoadProgress, LoadStage, Source};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Whether `model` reads as a hub repo id: `org/name`, each part `[A-Za-z0-9][A-Za-z0-9._-]*`,
/// without `..` or `--` (the hub forbids both), at most 96 characters.
pub fn is_repo_id(model: &str) -> bool {
    let part = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !s.contains("..")
            && !s.contains("--")
    };
    model.len() <= 96
        && matches!(model.split_once('/'), Some((org, name)) if part(org) && part(name))
}

/// Whether `revision` can name a branch, tag or commit without leaving `refs/` in the cache
/// (it becomes a file path there): no `..`, no leading `/`, no backslash, `%` or control
/// characters (no encoded separators either), at most 255 bytes.
fn is_revision(revision: &str) -> bool {
    !revision.is_empty()
        && revision.len() <= 255
        && !revision.contains("..")
        && !revision.starts_with('/')
        && !revision.ends_with('/')
        && !revision.contains("//")
        && !revision
            .chars()
            .any(|c| c.is_control() || matches!(c, '\\' | '%'))
}

/// The snapshot directory of `req.model` at `req.revision`: from the cache, or downloaded.
pub(crate) fn resolve(
    req: &Source,
    progress: &mut dyn FnMut(LoadProgress),
    cancelled: &dyn Fn() -> bool,
) -> Result<PathBuf, Error> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let settings = Settings::from_env(&env)?;
    let revision = req.revision.unwrap_or("main");
    if !is_revision(revision) {
        return Err(Error::InvalidParams {
            field: "revision".into(),
            reason: format!("`{revision}` is not a branch, tag or commit"),
        });
    }
    let cached = cached_snapshot(&settings.cache, req.model, revision);
    if settings.offline {
        return cached.ok_or_else(|| {
            Error::load(
                LoadErrorKind::NotFound,
                format!(
                    "`{}` (revision {revision}) is not cached in {} and HF_HUB_OFFLINE is set: \
                     unset HF_HUB_OFFLINE to download it, or give a local model directory",
                    req.model,
                    settings.cache.display()
                ),
            )
        });
    }
    let token = req
        .hf_token
        .map(|t| t.expose().trim().to_owned())
        .filter(|t| !t.is_empty())
        .or_else(|| env("HF_TOKEN"))
        .or_else(|| {
            let file = std::fs::read_to_string(settings.token_file.as_ref()?).ok()?;
            Some(file.trim().to_owned()).filter(|t| !t.is_empty())
        });
    let failure = Failure {
        repo: req.model,
        revision,
        endpoint: &settings.endpoint,
        token_given: token.is_some(),
    };
    let api = ApiBuilder::from_cache(Cache::new(settings.cache.clone()))
        .with_endpoint(settings.endpoint.clone())
        .with_token(token)
        .with_progress(false)
        .with_retries(2)
        .build()
        .map_err(|e| failure.of(e, None))?;
    let repo = Repo::with_revision(req.model.to_owned(), RepoType::Model, revision.to_owned());
    let api_repo = api.repo(repo.clone());

    progress(LoadProgress {
        stage: LoadStage::Resolve,
        done: 0,
        total: 1,
        message: format!("{} ({revision}) at {}", req.model, settings.endpoint),
    });
    let info = match api_repo.info() {
        Ok(info) => info,
        Err(e) => {
            let error = failure.of(e, None);
            // Like huggingface_hub: an unreachable hub falls back to what the cache holds.
            if let (
                Error::Load {
                    kind: LoadErrorKind::Network,
                    detail,
                },
                Some(dir),
            ) = (&error, &cached)
            {
                tracing::warn!(%detail, dir = %dir.display(), "hub unreachable; using the cache");
                return Ok(dir.clone());
            }
            return Err(error);
        }
    };
    let files = model_files(info.siblings.iter().map(|s| s.rfilename.as_str()));
    if !files.iter().any(|f| CONFIGS.contains(&f.as_str())) {
        return Err(Error::load(
            LoadErrorKind::NotFound,
            format!(
                "`{}` (revision {revision}) has no config.json (nor adapter_config.json): not a \
                 Transformers/MLX model repo or a LoRA adapter repo",
                req.model
            ),
        ));
    }
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        return Err(Error::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "`{}` (revision {revision}) has no .safetensors weights (PyTorch .bin and other \
                 formats are not read): pick an MLX or safetensors export of the model",
                req.model
            ),
        ));
    }

    let snapshot = repo_dir(&settings.cache, req.model)
        .join("snapshots")
        .join(&info.sha);
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| !snapshot.join(f).is_file())
        .collect();
    tracing::info!(
        repo = %req.model, revision, commit = %info.sha, files = files.len(),
        to_download = missing.len(), cache = %settings.cache.display(), "hub model"
    );
    for (i, file) in missing.iter().enumerate() {
        if cancelled() {
            return Err(Error::Cancelled);
        }
        let expected = std::cell::Cell::new(0);
        let reporter = Reporter {
            progress: &mut *progress,
            label: format!("{file} ({}/{})", i + 1, missing.len()),
            expected: &expected,
            total: 0,
            done: 0,
            sent: None,
        };
        let path =
            api_repo
                .download_with_progress(file, reporter)
                .map_err(|e| match out_of_space(&e) {
                    Some(io) => no_space(&settings.cache, req.model, file, expected.get(), io),
                    None => failure.of(e, Some(file)),
                })?;
        check_complete(&path, expected.get()).map_err(|detail| {
            Error::load(
                LoadErrorKind::Network,
                format!("`{}` file {file}: {detail}", req.model),
            )
        })?;
    }
    if revision != info.sha {
        Cache::new(settings.cache.clone())
            .repo(repo)
            .create_ref(&info.sha)
            .map_err(|e| {
                Error::load(
                    LoadErrorKind::Network,
                    format!(
                        "writing refs/{revision} in {}: {e}",
                        settings.cache.display()
                    ),
                )
            })?;
    }
    if !snapshot.join("config.json").is_file() {
        // The branch moved between the listing and the downloads: the files went to a newer
        // snapshot, which refs/<revision> now names.
        return cached_snapshot(&settings.cache, req.model, revision).ok_or_else(|| {
            Error::load(
                LoadErrorKind::Network,
                format!(
                    "`{}` changed on the hub while downloading: load it again",
                    req.model
                ),
            )
        });
    }
    Ok(snapshot)
}

/// hf-hub 0.4 takes a connection that closes early for the end of the file and stores what
/// came as the complete blob. A downloaded file shorter than the hub said goes back to being a
/// partial download (`blobs/<etag>.part`, which the next load resumes) and its snapshot link
/// is removed, so that no half file in the cache ever looks complete.
fn check_complete(path: &Path, expected: u64) -> Result<(), String> {
    let blob = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let got = std::fs::metadata(&blob).map_or(0, |m| m.len());
    if got == expected {
        return Ok(());
    }
    let _ = std::fs::remove_file(path);
    let _ = std::fs::rename(&blob, blob.with_extension("part"));
    Err(format!(
        "the download ended after {got} of {expected} bytes (the connection closed early); \
         load again to resume it"
    ))
}

/// The write error of a download that ran out of room: a full disk, a quota, a file size limit.
fn out_of_space(error: &ApiError) -> Option<&std::io::Error> {
    use std::io::ErrorKind::{FileTooLarge, QuotaExceeded, StorageFull};
    match error {
        ApiError::TooManyRetries(inner) => out_of_space(inner),
        ApiError::IoError(e) if matches!(e.kind(), StorageFull | QuotaExceeded | FileTooLarge) => {
            Some(e)
        }
        _ => None,
    }
}

/// A download stopped by a full disk: hf-hub leaves what was written in `blobs/<etag>.part`
/// (never renamed to the blob, so nothing looks complete) and the next load resumes from it.
/// Says how many bytes of this file are still to come: the least to free.
fn no_space(cache: &Path, repo: &str, file: &str, expected: u64, io: &std::io::Error) -> Error {
    let written = newest_part(&repo_dir(cache, repo).join("blobs")).unwrap_or(0);
    let free = match expected.checked_sub(written) {
        Some(left) if expected > 0 => format!("free at least {left} bytes there"),
        _ => "free space there".to_owned(),
    };
    Error::load(
        LoadErrorKind::Network,
        format!(
            "no space left on device for the hub cache at {} (`{repo}` file {file}: {written} of \
             {expected} bytes written; {io}): {free} and load again, the download resumes where \
             it stopped",
            cache.display()
        ),
    )
}

/// The length of the most recently written `*.part` file in `blobs`.
fn newest_part(blobs: &Path) -> Option<u64> {
    std::fs::read_dir(blobs)
        .ok()?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "part"))
        .filter_map(|e| e.metadata().ok())
        .max_by_key(|m| m.modified().ok())
        .map(|m| m.len())
}

/// Where the hub cache is, which endpoint to use, whether to stay offline.
#[derive(Debug, PartialEq)]
struct Settings {
    cache: PathBuf,
    endpoint: String,
    offline: bool,
    token_file: Option<PathBuf>,
}

impl Settings {
    /// From environment variables as huggingface_hub reads them (`env` looks one up).
    fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let hf_home = env("HF_HOME").map(PathBuf::from).or_else(|| {
            env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("huggingface"))
        });
        let cache = env("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .ok_or_else(|| {
                Error::load(
                    LoadErrorKind::NotFound,
                    "no Hugging Face cache directory: set HF_HOME, HF_HUB_CACHE or HOME",
                )
            })?;
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "yes" | "true"
            )
        });
        Ok(Self {
            cache,
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
                .trim_end_matches('/')
                .to_owned(),
            offline,
            token_file: env("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .or_else(|| hf_home.map(|h| h.join("token"))),
        })
    }
}

/// `models--org--name` in the cache.
fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(Repo::model(repo.to_owned()).folder_name())
}

/// The cached snapshot of `repo` at `revision` (a ref, or a commit with a snapshot), when it holds
/// a config.json and some safetensors.
fn cached_snapshot(cache: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let dir = repo_dir(cache, repo);
    let commit = if is_commit(revision) && dir.join("snapshots").join(revision).is_dir() {
        revision.to_owned()
    } else {
        std::fs::read_to_string(dir.join("refs").join(revision))
            .ok()?
            .trim()
            .to_owned()
    };
    let snapshot = dir.join("snapshots").join(commit);
    let has_weights = std::fs::read_dir(&snapshot)
        .ok()?
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"));
    let has_config = CONFIGS.iter().any(|c| snapshot.join(c).is_file());
    (has_weights && has_config).then_some(snapshot)
}

/// What makes a repo loadable: a model's config, or a LoRA adapter's.
const CONFIGS: [&str; 2] = ["config.json", "adapter_config.json"];

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The files of a repo a model needs: top-level configs and tokenizer files, the chat template,
/// a vision model's processor configs, and the weights (`model*.safetensors` as mlx-lm takes
/// them, else any top-level `*.safetensors`, which skips `consolidated.safetensors` duplicates when both exist, and
/// takes a LoRA adapter's `adapters.safetensors` / `adapter_model.safetensors`).
fn model_files<'a>(siblings: impl Iterator<Item = &'a str>) -> Vec<String> {
    const NAMED: &[&str] = &[
        "config.json",
        "adapter_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
        // Vision models' image processor.
        "preprocessor_config.json",
        "processor_config.json",
    ];
    let top: BTreeSet<&str> = siblings.filter(|f| !f.contains('/')).collect();
    let weights = |f: &&&str| f.ends_with(".safetensors");
    let mut chosen: Vec<String> = top
        .iter()
        .filter(weights)
        .filter(|f| f.starts_with("model"))
        .map(|f| f.to_string())
        .collect();
    if chosen.is_empty() {
        chosen = top.iter().filter(weights).map(|f| f.to_string()).collect();
    }
    // Small files first, so that a repo without a usable config fails before the weights.
    let mut files: Vec<String> = NAMED
        .iter()
        .filter(|f| top.contains(*f))
        .map(|f| f.to_string())
        .collect();
    files.append(&mut chosen);
    files
}

/// `load/progress` (stage "download") for one file, every 1% (at least 64 KiB apart).
struct Reporter<'a> {
    progress: &'a mut dyn FnMut(LoadProgress),
    label: String,
    /// The file's size as the hub gave it, for the check after the download.
    expected: &'a std::cell::Cell<u64>,
    total: u64,
    done: u64,
    sent: Option<u64>,
}

impl Reporter<'_> {
    fn send(&mut self) {
        self.sent = Some(self.done);
        (self.progress)(LoadProgress {
            stage: LoadStage::Download,
            done: self.done,
            total: self.total,
            message: self.label.clone(),
        });
    }
}

impl Progress for Reporter<'_> {
    fn init(&mut self, size: usize, _filename: &str) {
        // hf-hub calls this again before each (resumed) request, then `update(offset)`.
        self.total = size as u64;
        self.expected.set(self.total);
        self.done = 0;
        if self.sent.is_none() {
            self.send();
        }
    }

    fn update(&mut self, size: usize) {
        self.done += size as u64;
        let step = (self.total / 100).max(64 << 10);
        if self.done >= self.sent.unwrap_or(0) + step {
            self.send();
        }
    }

    fn finish(&mut self) {
        if self.sent != Some(self.done) {
            self.send();
        }
    }
}

/// Turns `hf-hub`'s errors into load errors that say what to do.
struct Failure<'a> {
    repo: &'a str,
    revision: &'a str,
    endpoint: &'a str,
    token_given: bool,
}

impl Failure<'_> {
    fn of(&self, error: ApiError, file: Option<&str>) -> Error {
        let (repo, revision, endpoint) = (self.repo, self.revision, self.endpoint);
        let what = match file {
            Some(f) => format!("`{repo}` ({revision}) file {f}"),
            None => format!("`{repo}` ({revision})"),
        };
        let (kind, detail) = match error {
            ApiError::TooManyRetries(inner) => return self.of(*inner, file),
            ApiError::RequestError(e) => match *e {
                ureq::Error::Status(status, response) => {
                    let code = response.header("x-error-code").unwrap_or("").to_owned();
                    self.status(status, &code, &what)
                }
                ureq::Error::Transport(t) => (
                    LoadErrorKind::Network,
                    format!(
                        "cannot reach the hub at {endpoint} for {what}: {t}; check the network \
                         or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to load from the cache"
                    ),
                ),
            },
            ApiError::IoError(e) => (
                LoadErrorKind::Network,
                format!("{what}: {e} (reading the hub's answer or writing the cache)"),
            ),
            ApiError::InvalidResume => (
                LoadErrorKind::InvalidWeights,
                format!(
                    "{what}: the partial download in the cache's blobs/ is longer than the file; \
                     delete the *.part file there and load again"
                ),
            ),
            ApiError::LockAcquisition(path) => (
                LoadErrorKind::Network,
                format!(
                    "{what}: another process is downloading it ({} is locked); load again later",
                    path.display()
                ),
            ),
            other => (
                LoadErrorKind::Network,
                format!("{what}: unexpected answer from {endpoint}: {other}"),
            ),
        };
        Error::load(kind, detail)
    }

    fn status(&self, status: u16, error_code: &str, what: &str) -> (LoadErrorKind, String) {
        match (status, error_code) {
            (_, "RepositoryNotFound") | (404, _) if error_code != "RevisionNotFound" => {
                let private = if self.token_given {
                    ""
                } else {
                    "; if it is private, pass hf_token"
                };
                let missing = if error_code == "EntryNotFound" {
                    "is missing on the hub"
                } else {
                    "was not found on the hub"
                };
                (
                    LoadErrorKind::NotFound,
                    format!("{what} {missing} (HTTP {status}){private}"),
                )
            }
            (404, _) => (
                LoadErrorKind::NotFound,
                format!("{what}: no such revision on the hub (HTTP 404)"),
            ),
            (401 | 403, _) if self.token_given => (
                LoadErrorKind::AuthRequired,
                format!(
                    "{what}: the repo is gated or private and the token has no access \
                     (HTTP {status}): accept the model's terms on the hub or use another hf_token"
                ),
            ),
            (401 | 403, _) => (
                LoadErrorKind::AuthRequired,
                format!("{what}: the repo is gated or private (HTTP {status}): pass hf_token"),
            ),
            _ => (
                LoadErrorKind::Network,
                format!(
                    "{what}: the hub at {} answered HTTP {status}; try again later",
                    self.endpoint
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HfToken;

    #[test]
    fn a_full_disk_a_quota_or_a_file_size_limit_is_out_of_space_and_nothing_else() {
        use std::io;
        // ENOSPC, EDQUOT, EFBIG (Linux numbers), also behind hf-hub's retries.
        for errno in [28, 122, 27] {
            let e = ApiError::IoError(io::Error::from_raw_os_error(errno));
            assert!(out_of_space(&e).is_some(), "{errno}");
            let retried = ApiError::TooManyRetries(Box::new(e));
            assert!(out_of_space(&retried).is_some(), "{errno}");
        }
        let reset = ApiError::IoError(io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(out_of_space(&reset).is_none());
    }

    #[test]
    fn revisions_stay_inside_refs() {
        for ok in [
            "main",
            "v1.0",
            "refs/pr/1",
            "0123456789abcdef0123456789abcdef01234567",
        ] {
            assert!(is_revision(ok), "{ok}");
        }
        for bad in [
            "",
            "..",
            "../../etc/passwd",
            "a/../b",
            "/etc",
            "a/",
            "a//b",
            "a\\..\\b",
            "%2e%2e%2fx",
            "..%2F..",
            "a\0b",
            "a\nb",
        ] {
            assert!(!is_revision(bad), "{bad:?}");
        }
        assert!(!is_revision(&"a".repeat(256)));
    }

    #[test]
    fn repo_ids_are_org_slash_name() {
        for id in [
            "mlx-community/Llama-3.2-1B-Instruct-4bit",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "a/b",
            "org/name.v1_2",
        ] {
            assert!(is_repo_id(id), "{id}");
        }
        for id in [
            "gpt2",
            "/abs/path",
            "./rel/path",
            "a/b/c",
            "../x",
            "org/..",
            "org/a--b",
            "org/",
            "/name",
            "org/na me",
            "models/x.gguf/",
        ] {
            assert!(!is_repo_id(id), "{id}");
        }
    }

    #[test]
    fn settings_follow_huggingface_hub() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let s = Settings::from_env(&env(&[("HOME", "/home/u")])).unwrap();
        assert_eq!(
            s,
            Settings {
                cache: "/home/u/.cache/huggingface/hub".into(),
                endpoint: DEFAULT_ENDPOINT.into(),
                offline: false,
                token_file: Some("/home/u/.cache/huggingface/token".into()),
            }
        );
        let s = Settings::from_env(&env(&[
            ("HOME", "/home/u"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HF_HUB_OFFLINE", "1"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
        ]))
        .unwrap();
        assert_eq!(s.cache, PathBuf::from("/xdg/huggingface/hub"));
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.offline);
        let s = Settings::from_env(&env(&[
            ("HOME", "/home/u"),
            ("HF_HOME", "/hf"),
            ("HF_HUB_OFFLINE", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (s.cache, s.token_file, s.offline),
            ("/hf/hub".into(), Some("/hf/token".into()), false)
        );
        let s = Settings::from_env(&env(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/cache"),
            ("HF_TOKEN_PATH", "/t"),
            ("HF_HUB_OFFLINE", "TRUE"),
        ]))
        .unwrap();
        assert_eq!(
            (s.cache, s.token_file, s.offline),
            ("/cache".into(), Some("/t".into()), true)
        );
        assert!(Settings::from_env(&env(&[])).is_err());
    }

    #[test]
    fn only_the_files_a_model_needs() {
        let siblings = [
            ".gitattributes",
            "README.md",
            "config.json",
            "consolidated.safetensors",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "original/model.safetensors",
            "pytorch_model.bin",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "preprocessor_config.json",
            "processor_config.json",
        ];
        assert_eq!(
            model_files(siblings.into_iter()),
            [
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja",
                "preprocessor_config.json",
                "processor_config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
            ]
        );
        // Old MLX exports name their weights differently.
        assert_eq!(
            model_files(["config.json", "weights.00.safetensors"].into_iter()),
            ["config.json", "weights.00.safetensors"]
        );
    }

    #[test]
    fn offline_cache_lookup_reads_refs_or_commits() {
        let cache = std::env::temp_dir().join(format!("mlx-hub-test-{}", std::process::id()));
        let repo = repo_dir(&cache, "org/name");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let snap = repo.join("snapshots").join(sha);
        std::fs::create_dir_all(&snap).unwrap();
        assert_eq!(cached_snapshot(&cache, "org/name", "main"), None);
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), sha).unwrap();
        assert_eq!(cached_snapshot(&cache, "org/name", "main"), None); // empty snapshot
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::write(snap.join("model.safetensors"), "").unwrap();
        assert_eq!(
            cached_snapshot(&cache, "org/name", "main"),
            Some(snap.clone())
        );
        assert_eq!(cached_snapshot(&cache, "org/name", sha), Some(snap));
        assert_eq!(cached_snapshot(&cache, "org/name", "dev"), None);
        std::fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let token = HfToken::new("hf_do_not_print");
        let req = Source {
            model: "org/gated",
            revision: None,
            hf_token: Some(&token),
        };
        let shown = format!("{req:?} {token:#?}");
        assert!(!shown.contains("hf_do_not_print"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
