// `load` by Hugging Face repo id, end to end: the real binary downloads from a loopback hub
// (a small HTTP/1.1 server in this file that answers like huggingface.co: the model info API,
// `resolve` with ETag / X-Repo-Commit / Range, gated repos, X-Error-Code) into a temporary
// HF_HOME, in the standard cache layout, then loads offline from that cache.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

use crate::support::{greedy, rpc_error, within, within_for};
use fixtures::{write_tiny_llama, write_tiny_lora, AdapterLayout, TinyLlama};
use protocol::error::LoadFailedData;
use protocol::methods::{Load, LoadParams, LoadProgress, LoadStage};
use protocol::{Client, ClientOptions, ErrorCode, LoadErrorKind};

const SHA: &str = "5d1f6a1c0e2b3a4f5d6e7f8091a2b3c4d5e6f708";
const TOKEN: &str = "hf_loopbackGatedSecret42";
/// Loading and answering with a vision model (debug build).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One file of a fake repo.
struct HubFile {
    bytes: Vec<u8>,
    etag: String,
}

/// A fake repo: its files by name, and the token it wants (gated) if any.
struct HubRepo {
    files: BTreeMap<String, HubFile>,
    token: Option<&'static str>,
    /// How many more downloads of a `.safetensors` file the server dies in the middle of.
    deaths: std::sync::atomic::AtomicU32,
}

/// One request the fake hub answered.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    range: Option<String>,
    authorization: Option<String>,
}

/// A loopback hub (tiny_http); it lives until the test process ends.
struct FakeHub {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeHub {
    fn start(repos: Vec<(&str, HubRepo)>) -> FakeHub {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let addr = server.server_addr().to_ip().expect("an IP listener");
        let repos: Arc<BTreeMap<String, HubRepo>> = Arc::new(
            repos
                .into_iter()
                .map(|(id, r)| (id.to_owned(), r))
                .collect(),
        );
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for request in server.incoming_requests() {
                let (repos, log) = (repos.clone(), log.clone());
                std::thread::spawn(move || serve(request, &repos, &log));
            }
        });
        FakeHub { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The `Range` headers of the GETs of `model.safetensors`, in order.
    fn weight_ranges(&self) -> Vec<String> {
        self.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path.ends_with("/model.safetensors"))
            .filter_map(|s| s.range.clone())
            .collect()
    }
}

/// Answers one request.
fn serve(request: tiny_http::Request, repos: &BTreeMap<String, HubRepo>, log: &Mutex<Vec<Seen>>) {
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|h| h.field.to_string().eq_ignore_ascii_case(name))
            .map(|h| h.value.to_string())
    };
    let seen = Seen {
        method: request.method().to_string(),
        path: request.url().to_owned(),
        range: header("Range"),
        authorization: header("Authorization"),
    };
    log.lock().unwrap().push(seen.clone());
    let (status, headers, mut body) = answer(&seen, repos);
    // The server dying mid-download: half the body, then the connection closes (the
    // Content-Length still promises all of it).
    let repo_id: Vec<&str> = seen.path.trim_start_matches('/').splitn(3, '/').collect();
    let dies = seen.method == "GET"
        && seen.path.ends_with(".safetensors")
        && body.len() > 1
        && repos
            .get(&repo_id[..2.min(repo_id.len())].join("/"))
            .is_some_and(|r| {
                r.deaths
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            });
    let full = body.len();
    if dies {
        body.truncate(full / 2);
    }
    // A HEAD answer carries the file's length but no body (tiny_http leaves the body out).
    let length = headers
        .iter()
        .find(|(k, _)| k == "Content-Length")
        .map_or(full, |(_, v)| v.parse().unwrap());
    let code: u16 = status[..3].parse().unwrap();
    let headers = headers
        .iter()
        .filter(|(k, _)| k != "Content-Length")
        .map(|(k, v)| tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap())
        .collect();
    let response = tiny_http::Response::new(
        code.into(),
        headers,
        std::io::Cursor::new(body),
        Some(length),
        None,
    );
    let _ = request.respond(response);
}

type Reply = (&'static str, Vec<(String, String)>, Vec<u8>);

fn error(status: &'static str, code: &str) -> Reply {
    let body = format!("{{\"error\":\"{code}\"}}").into_bytes();
    (
        status,
        vec![
            ("X-Error-Code".into(), code.into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        body,
    )
}

/// What huggingface.co answers (the parts hf-hub and huggingface_hub read).
fn answer(req: &Seen, repos: &BTreeMap<String, HubRepo>) -> Reply {
    let (repo_id, rest, api) = if let Some(p) = req.path.strip_prefix("/api/models/") {
        match p.split_once("/revision/") {
            Some((id, rev)) => (id.to_owned(), rev.to_owned(), true),
            None => return error("404 Not Found", "RepositoryNotFound"),
        }
    } else {
        let p: Vec<&str> = req.path.trim_start_matches('/').splitn(5, '/').collect();
        if p.len() != 5 || p[2] != "resolve" {
            return error("404 Not Found", "EntryNotFound");
        }
        (
            format!("{}/{}", p[0], p[1]),
            format!("{}/{}", p[3], p[4]),
            false,
        )
    };
    // Like the real hub: an unknown repo is a 401 for anonymous callers.
    let Some(repo) = repos.get(&repo_id) else {
        return error("401 Unauthorized", "RepositoryNotFound");
    };
    if let Some(token) = repo.token {
        if req.authorization.as_deref() != Some(&format!("Bearer {token}")) {
            return error("401 Unauthorized", "GatedRepo");
        }
    }
    let (revision, file) = rest.split_once('/').unwrap_or((&rest, ""));
    if revision != "main" && revision != SHA {
        return error("404 Not Found", "RevisionNotFound");
    }
    if api {
        let siblings: Vec<_> = repo
            .files
            .keys()
            .map(|f| serde_json::json!({"rfilename": f}))
            .collect();
        let body = serde_json::json!({"id": repo_id, "sha": SHA, "siblings": siblings});
        return (
            "200 OK",
            vec![("Content-Type".into(), "application/json".into())],
            body.to_string().into_bytes(),
        );
    }
    let Some(f) = repo.files.get(file) else {
        return error("404 Not Found", "EntryNotFound");
    };
    let size = f.bytes.len();
    let mut headers = vec![
        ("ETag".to_owned(), format!("\"{}\"", f.etag)),
        ("X-Repo-Commit".to_owned(), SHA.to_owned()),
        ("Accept-Ranges".to_owned(), "bytes".to_owned()),
    ];
    let range = req.range.as_deref().and_then(|r| {
        let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
        let start: usize = a.parse().ok()?;
        let end: usize = if b.is_empty() {
            size.saturating_sub(1)
        } else {
            b.parse::<usize>().ok()?.min(size.saturating_sub(1))
        };
        Some((start, end))
    });
    match range {
        Some((start, end)) if start < size => {
            headers.push((
                "Content-Range".into(),
                format!("bytes {start}-{end}/{size}"),
            ));
            (
                "206 Partial Content",
                headers,
                f.bytes[start..=end].to_vec(),
            )
        }
        Some(_) => {
            headers.push(("Content-Range".into(), format!("bytes */{size}")));
            ("416 Range Not Satisfiable", headers, Vec::new())
        }
        None if req.method == "HEAD" => {
            headers.push(("Content-Length".into(), size.to_string()));
            ("200 OK", headers, Vec::new())
        }
        None => ("200 OK", headers, f.bytes.clone()),
    }
}

/// A repo holding a tiny Llama (seed `seed`) and files a model load must not fetch.
fn tiny_repo(seed: u64, token: Option<&'static str>) -> HubRepo {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(
        dir.path(),
        &TinyLlama {
            seed,
            ..Default::default()
        },
    )
    .unwrap();
    repo_of(dir.path(), token)
}

/// A repo holding a PEFT LoRA adapter for the tiny Llama, naming `base` (a repo id) as its base.
fn tiny_lora_repo(base: &str) -> HubRepo {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_lora(dir.path(), 3, AdapterLayout::Peft, base).unwrap();
    repo_of(dir.path(), None)
}

/// A repo of the files in `dir`, plus files a load must not fetch.
fn repo_of(dir: &Path, token: Option<&'static str>) -> HubRepo {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        files.insert(name, std::fs::read(&path).unwrap());
    }
    files.insert("README.md".into(), b"# tiny\n".to_vec());
    files.insert("pytorch_model.bin".into(), vec![7; 1000]);
    files.insert("original/model.safetensors".into(), vec![7; 1000]);
    HubRepo {
        files: files
            .into_iter()
            .map(|(name, bytes)| {
                let etag = etag(&bytes);
                (name, HubFile { bytes, etag })
            })
            .collect(),
        token,
        deaths: Default::default(),
    }
}

/// A content hash as the blob name (the hub uses sha256 for LFS files, git's sha1 for others).
fn etag(bytes: &[u8]) -> String {
    use sha2::Digest;
    // The hub's ETag of a file stored with Git LFS is its sha256, which names its blob.
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// The worker with a hub endpoint and HF_HOME, the HF variables of this process cleared.
fn hub_worker(endpoint: &str, hf_home: &Path, env: &[(&str, &str)]) -> Client {
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"));
    hub_worker_by(command, endpoint, hf_home, env)
}

/// The worker on a full disk: in its own user and mount namespaces (no root needed), HF_HOME
/// is a tmpfs of `size` bytes of which a file `filler` takes `filled`, so writes past the rest
/// fail with ENOSPC, as on a real full disk. The test sees that tmpfs through
/// `/proc/<pid>/root`.
fn full_disk_worker(endpoint: &str, hf_home: &Path, size: u64, filled: u64) -> Client {
    const SCRIPT: &str = r#"set -e
mount -t tmpfs -o "size=$3" tmpfs "$2"
head -c "$4" /dev/zero > "$2/filler"
exec "$1""#;
    let mut command = tokio::process::Command::new("unshare");
    command.args([
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        SCRIPT,
        "sh",
    ]);
    command
        .arg(env!("CARGO_BIN_EXE_mlx-worker"))
        .arg(hf_home)
        .arg(size.to_string())
        .arg(filled.to_string());
    hub_worker_by(command, endpoint, hf_home, &[])
}

fn hub_worker_by(
    mut command: tokio::process::Command,
    endpoint: &str,
    hf_home: &Path,
    env: &[(&str, &str)],
) -> Client {
    command
        .env("MLX_WORKER_LOG", "debug")
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", hf_home);
    for var in [
        "HF_HUB_CACHE",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let options = ClientOptions {
        echo_stderr: std::env::var_os("ECHO_WORKER_STDERR").is_some(),
        stderr_tail_bytes: 16 << 20,
        ..Default::default()
    };
    Client::spawn_command(command, options).expect("start mlx-worker")
}

/// `load/progress` notifications up to "ready" (or the first other notification).
async fn progress_until_ready(w: &Client) -> Vec<LoadProgress> {
    let mut all = Vec::new();
    loop {
        let n = within(w.next_notification()).await.unwrap();
        assert_eq!(n.method, "load/progress");
        let p: LoadProgress = n.parse_params().unwrap();
        let ready = p.stage == LoadStage::Ready;
        all.push(p);
        if ready {
            return all;
        }
    }
}

fn load_failure(
    result: Result<protocol::methods::LoadResult, protocol::ClientError>,
) -> LoadFailedData {
    rpc_error(result, ErrorCode::LoadFailed)
        .data_as::<LoadFailedData>()
        .expect("-32002 carries {kind, detail}")
}

fn repo_cache(hf_home: &Path, repo: &str) -> PathBuf {
    hf_home
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
}

/// A port nothing listens on.
fn dead_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

#[tokio::test]
async fn downloads_into_the_hub_cache_with_progress_then_loads_offline() {
    let repo = tiny_repo(0, None);
    let weights = repo.files["model.safetensors"].bytes.clone();
    let hub = FakeHub::start(vec![("org/tiny", repo)]);
    let home = tempfile::tempdir().unwrap();

    let w = hub_worker(&hub.url(), home.path(), &[]);
    let loaded = within(w.call::<Load>(&LoadParams::new("org/tiny")))
        .await
        .unwrap();
    assert_eq!(loaded.model_id, "org/tiny");
    let progress = progress_until_ready(&w).await;
    let downloads: Vec<&LoadProgress> = progress
        .iter()
        .filter(|p| p.stage == LoadStage::Download)
        .collect();
    // Per file: byte counts grow to the file's size; the weights report several steps.
    let mut files = BTreeMap::<String, Vec<(u64, u64)>>::new();
    for p in &downloads {
        let name = p.message.split(' ').next().unwrap().to_owned();
        files.entry(name).or_default().push((p.done, p.total));
    }
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    for (name, steps) in &files {
        assert!(
            steps.windows(2).all(|s| s[0].0 <= s[1].0),
            "{name}: {steps:?}"
        );
        let (done, total) = *steps.last().unwrap();
        assert!(done == total && total > 0, "{name}: {steps:?}");
    }
    let weight_steps = &files["model.safetensors"];
    assert!(weight_steps.len() >= 4, "{weight_steps:?}");
    assert_eq!(weight_steps.last().unwrap().1, weights.len() as u64);

    let (_, first) = within(w.generate(&greedy("hi", 12)).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(first.usage.completion_tokens, 12);
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));

    // The standard layout: refs/main -> commit; snapshot files are relative links to blobs/.
    let cache = repo_cache(home.path(), "org/tiny");
    assert_eq!(
        std::fs::read_to_string(cache.join("refs/main")).unwrap(),
        SHA
    );
    let snapshot = cache.join("snapshots").join(SHA);
    let link = std::fs::read_link(snapshot.join("model.safetensors")).unwrap();
    assert_eq!(
        link,
        Path::new("../../blobs").join(etag(&weights)),
        "{link:?}"
    );
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
    let mut names: Vec<String> = std::fs::read_dir(&snapshot)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, files.keys().cloned().collect::<Vec<_>>());
    let fetched = hub.seen().len();

    // Offline: from the cache alone (the endpoint is dead and the hub sees nothing).
    let w = hub_worker(&dead_endpoint(), home.path(), &[("HF_HUB_OFFLINE", "1")]);
    within(w.call::<Load>(&LoadParams::new("org/tiny")))
        .await
        .unwrap();
    let (_, again) = within(w.generate(&greedy("hi", 12)).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(again.text, first.text);
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
    assert_eq!(hub.seen().len(), fetched);

    // Online again with everything cached: one API call, no file is fetched again.
    let w = hub_worker(&hub.url(), home.path(), &[]);
    within(w.call::<Load>(&LoadParams::new("org/tiny")))
        .await
        .unwrap();
    let later: Vec<String> = hub.seen()[fetched..]
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(later, ["/api/models/org/tiny/revision/main"]);
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_partial_download_resumes_with_a_range_request() {
    let repo = tiny_repo(1, None);
    let weights = repo.files["model.safetensors"].bytes.clone();
    let blob = etag(&weights);
    let hub = FakeHub::start(vec![("org/tiny", repo)]);
    let home = tempfile::tempdir().unwrap();
    let blobs = repo_cache(home.path(), "org/tiny").join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = weights.len() / 2;
    std::fs::write(blobs.join(format!("{blob}.part")), &weights[..half]).unwrap();

    let w = hub_worker(&hub.url(), home.path(), &[]);
    within(w.call::<Load>(&LoadParams::new("org/tiny")))
        .await
        .unwrap();
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
    let ranges = hub.weight_ranges();
    // The metadata probe (bytes=0-0), then the rest from where the partial file ends.
    assert_eq!(ranges, ["bytes=0-0".to_owned(), format!("bytes={half}-")]);
    assert_eq!(std::fs::read(blobs.join(&blob)).unwrap(), weights);
    assert!(!blobs.join(format!("{blob}.part")).exists());
}

#[tokio::test]
async fn a_server_that_dies_mid_download_leaves_nothing_that_looks_complete() {
    let repo = tiny_repo(2, None);
    let weights = repo.files["model.safetensors"].bytes.clone();
    let blob = etag(&weights);
    repo.deaths.store(1, SeqCst);
    let hub = FakeHub::start(vec![("org/tiny", repo)]);
    let home = tempfile::tempdir().unwrap();
    let w = hub_worker(&hub.url(), home.path(), &[]);

    let data = load_failure(within(w.call::<Load>(&LoadParams::new("org/tiny"))).await);
    assert!(data.detail.contains("model.safetensors"), "{}", data.detail);
    let cache = repo_cache(home.path(), "org/tiny");
    assert_nothing_looks_complete(&cache, &blob);

    // The next load resumes where the download stopped and the model answers.
    loads_whole_and_answers(&w, &cache, &blob, &weights).await;
    let ranges = hub.weight_ranges();
    assert!(
        ranges.iter().any(|r| r != "bytes=0-0"),
        "resumed with a range: {ranges:?}"
    );
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_disk_that_fills_up_mid_download_says_what_to_free_and_the_next_load_resumes() {
    let repo = tiny_repo(3, None);
    let weights = repo.files["model.safetensors"].bytes.clone();
    let blob = etag(&weights);
    let hub = FakeHub::start(vec![("org/tiny", repo)]);
    let home = tempfile::tempdir().unwrap();
    // Room for the configs and tokenizer, not for the weights.
    let (size, filled) = (1 << 20, (1 << 20) - weights.len() as u64 / 2);
    let w = full_disk_worker(&hub.url(), home.path(), size, filled);
    let inside = Path::new(&format!("/proc/{}/root", w.pid().unwrap()))
        .join(home.path().strip_prefix("/").unwrap());

    let data = load_failure(within(w.call::<Load>(&LoadParams::new("org/tiny"))).await);
    assert_eq!(data.kind, LoadErrorKind::Network, "{}", data.detail);
    let cache = repo_cache(&inside, "org/tiny");
    let part = cache.join("blobs").join(format!("{blob}.part"));
    let written = std::fs::metadata(&part).unwrap().len();
    assert!(written < weights.len() as u64);
    for words in [
        "no space left on device".to_owned(),
        "model.safetensors".to_owned(),
        format!("free at least {} bytes", weights.len() as u64 - written),
        "load again".to_owned(),
    ] {
        assert!(
            data.detail.contains(&words),
            "`{words}` not in {}",
            data.detail
        );
    }
    assert_nothing_looks_complete(&cache, &blob);

    // Space freed, the next load resumes from what was written and the model answers.
    std::fs::remove_file(inside.join("filler")).unwrap();
    loads_whole_and_answers(&w, &cache, &blob, &weights).await;
    let ranges = hub.weight_ranges();
    assert!(
        ranges.contains(&format!("bytes={written}-")),
        "resumed from {written}: {ranges:?}"
    );
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn an_adapter_repo_loads_with_its_base_repo_then_offline() {
    let hub = FakeHub::start(vec![
        ("org/tiny", tiny_repo(4, None)),
        ("org/tiny-lora", tiny_lora_repo("org/tiny")),
    ]);
    let home = tempfile::tempdir().unwrap();
    let w = hub_worker(&hub.url(), home.path(), &[]);
    // The adapter repo as `model`: its adapter_config.json names the base repo.
    let loaded = within(w.call::<Load>(&LoadParams::new("org/tiny-lora")))
        .await
        .unwrap();
    assert!(loaded.info.is_lora);
    let with_adapter = within(w.generate(&greedy("hi", 8)).unwrap().finish())
        .await
        .unwrap();
    // The base repo with the adapter repo as `adapter`: the same model.
    let mut params = LoadParams::new("org/tiny");
    params.adapter = Some("org/tiny-lora".into());
    let loaded = within(w.call::<Load>(&params)).await.unwrap();
    assert!(loaded.info.is_lora);
    let mut p = greedy("hi", 8);
    p.model = Some("org/tiny".into());
    let again = within(w.generate(&p).unwrap().finish()).await.unwrap();
    assert_eq!(again.text, with_adapter.text);
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
    let fetched: Vec<String> = hub
        .seen()
        .iter()
        .filter(|s| s.method == "GET" && s.path.starts_with("/org/tiny-lora/resolve/"))
        .map(|s| s.path.rsplit('/').next().unwrap().to_owned())
        .collect();
    assert!(
        fetched.contains(&"adapter_config.json".to_owned()),
        "{fetched:?}"
    );
    assert!(
        fetched.contains(&"adapter_model.safetensors".to_owned()),
        "{fetched:?}"
    );
    assert!(!fetched.contains(&"README.md".to_owned()), "{fetched:?}");

    // Both now come from the cache, with the hub unreachable.
    let offline = hub_worker(&dead_endpoint(), home.path(), &[("HF_HUB_OFFLINE", "1")]);
    let loaded = within(offline.call::<Load>(&LoadParams::new("org/tiny-lora")))
        .await
        .unwrap();
    assert!(loaded.info.is_lora);
    let cached = within(offline.generate(&greedy("hi", 8)).unwrap().finish())
        .await
        .unwrap();
    assert_eq!(cached.text, with_adapter.text);
    assert_eq!(within(offline.shutdown()).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_gated_repo_needs_the_token_which_is_never_shown() {
    let hub = FakeHub::start(vec![("org/gated", tiny_repo(2, Some(TOKEN)))]);
    let home = tempfile::tempdir().unwrap();
    let w = hub_worker(&hub.url(), home.path(), &[]);

    let failure = load_failure(within(w.call::<Load>(&LoadParams::new("org/gated"))).await);
    assert_eq!(failure.kind, LoadErrorKind::AuthRequired, "{failure:?}");
    assert!(failure.detail.contains("pass hf_token"), "{failure:?}");

    let mut wrong = LoadParams::new("org/gated");
    wrong.hf_token = Some("hf_wrong".into());
    let failure = load_failure(within(w.call::<Load>(&wrong)).await);
    assert_eq!(failure.kind, LoadErrorKind::AuthRequired, "{failure:?}");

    let mut params = LoadParams::new("org/gated");
    params.hf_token = Some(TOKEN.into());
    let loaded = within(w.call::<Load>(&params)).await.unwrap();
    let (_, result) = within(w.generate(&greedy("hi", 4)).unwrap().collect())
        .await
        .unwrap();
    assert_eq!(result.usage.completion_tokens, 4);
    let mut seen_by_host = serde_json::to_string(&loaded).unwrap();
    seen_by_host.push_str(&serde_json::to_string(&result).unwrap());
    while let Ok(Some(n)) =
        tokio::time::timeout(std::time::Duration::from_millis(50), w.next_notification()).await
    {
        seen_by_host.push_str(&n.params.to_string());
    }
    assert!(!seen_by_host.contains(TOKEN));
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));

    // The token reached the hub, and only as the Authorization header.
    let seen = hub.seen();
    let bearer = format!("Bearer {TOKEN}");
    assert!(seen
        .iter()
        .any(|s| s.authorization.as_deref() == Some(&bearer)));
    assert!(seen.iter().all(|s| !s.path.contains(TOKEN)));
    // The debug log talked about the hub and its requests, never with the token.
    let log = w.stderr_tail();
    assert!(log.contains("org/gated") && log.contains("DEBUG"), "{log}");
    assert!(!log.contains(TOKEN), "the token is in the log");
}

#[tokio::test]
async fn unreachable_hub_unknown_repo_and_offline_misses_say_what_to_do() {
    let home = tempfile::tempdir().unwrap();

    let w = hub_worker(&dead_endpoint(), home.path(), &[]);
    let failure = load_failure(within(w.call::<Load>(&LoadParams::new("org/tiny"))).await);
    assert_eq!(failure.kind, LoadErrorKind::Network, "{failure:?}");
    assert!(failure.detail.contains("HF_HUB_OFFLINE"), "{failure:?}");
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));

    let hub = FakeHub::start(vec![("org/tiny", tiny_repo(3, None))]);
    let w = hub_worker(&hub.url(), home.path(), &[]);
    let failure = load_failure(within(w.call::<Load>(&LoadParams::new("org/nope"))).await);
    assert_eq!(failure.kind, LoadErrorKind::NotFound, "{failure:?}");
    let mut params = LoadParams::new("org/tiny");
    params.revision = "no-such-branch".into();
    let failure = load_failure(within(w.call::<Load>(&params)).await);
    assert_eq!(failure.kind, LoadErrorKind::NotFound, "{failure:?}");
    assert!(failure.detail.contains("revision"), "{failure:?}");
    // Neither a directory nor a repo id.
    let failure = load_failure(within(w.call::<Load>(&LoadParams::new("no/such/dir"))).await);
    assert_eq!(failure.kind, LoadErrorKind::NotFound, "{failure:?}");
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));

    let w = hub_worker(&hub.url(), home.path(), &[("HF_HUB_OFFLINE", "1")]);
    let failure = load_failure(within(w.call::<Load>(&LoadParams::new("org/tiny"))).await);
    assert_eq!(failure.kind, LoadErrorKind::NotFound, "{failure:?}");
    assert!(failure.detail.contains("not cached"), "{failure:?}");
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_vision_repo_brings_its_image_processor_and_answers_like_its_directory() {
    use protocol::methods::{ChatMessage, ContentPart, GenerateParams, MessageContent};
    let Some(dir) = fixtures::vision_fixture("tiny-gemma3-vl") else {
        return;
    };
    let png = dir.parent().unwrap().join("images/gradient.png");
    let hub = FakeHub::start(vec![("org/tiny-vl", repo_of(&dir, None))]);
    let home = tempfile::tempdir().unwrap();
    let w = hub_worker(&hub.url(), home.path(), &[]);
    let mut question = GenerateParams::new(vec![ChatMessage {
        role: "user".into(),
        content: MessageContent::Parts(vec![
            ContentPart::Image {
                image: png.display().to_string(),
            },
            ContentPart::Text {
                text: "What is in this picture?".into(),
            },
        ]),
        extra: Default::default(),
    }]);
    question.max_new_tokens = 8;
    question.sampling.temperature = 0.0;
    let mut answers = Vec::new();
    for model in ["org/tiny-vl".to_string(), crate::support::model_id(&dir)] {
        let loaded = within_for(LIMIT, w.call::<Load>(&LoadParams::new(&model)))
            .await
            .unwrap();
        assert!(loaded.info.is_vision, "{model}");
        let answer = within_for(LIMIT, w.generate(&question).unwrap().finish())
            .await
            .unwrap();
        answers.push(answer.text);
    }
    assert_eq!(answers[0], answers[1]);
    let snapshot = repo_cache(home.path(), "org/tiny-vl")
        .join("snapshots")
        .join(SHA);
    for file in ["preprocessor_config.json", "processor_config.json"] {
        assert!(snapshot.join(file).is_file(), "{file} not downloaded");
    }
    assert_eq!(within(w.shutdown()).await.unwrap().code(), Some(0));
}

/// No blob of the weights and no snapshot link: a half download never looks complete.
fn assert_nothing_looks_complete(cache: &Path, blob: &str) {
    assert!(
        !cache.join("blobs").join(blob).exists(),
        "a half blob looks complete"
    );
    let link = cache.join("snapshots").join(SHA).join("model.safetensors");
    assert!(!link.exists());
}

/// Loads `org/tiny` again: its blob is then whole and the model answers.
async fn loads_whole_and_answers(w: &Client, cache: &Path, blob: &str, weights: &[u8]) {
    within(w.call::<Load>(&LoadParams::new("org/tiny")))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(cache.join("blobs").join(blob)).unwrap(),
        weights
    );
    within(w.generate(&greedy("hi", 4)).unwrap().finish())
        .await
        .unwrap();
}
