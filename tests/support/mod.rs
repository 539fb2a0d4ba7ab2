//! Shared by the end-to-end tests: start the real binary through the protocol crate's client,
//! and write tiny random models (fixtures) for it to load.

use std::path::Path;
use std::time::Duration;

use fixtures::{write_tiny_llama, TinyLlama};
use protocol::methods::{ChatMessage, GenerateParams, Load, LoadParams};
use protocol::{Client, ClientError, ClientOptions, ErrorCode, ResponseError};

/// Starts `mlx-worker` with `args`; set ECHO_WORKER_STDERR=1 to see its log.
pub fn worker(args: &[&str]) -> Client {
    spawn(worker_command(args))
}

/// Starts `mlx-worker` with `cache` as its cache directory (`MLX_WORKER_CACHE`), for a test
/// that loads a `.gguf`: the import (up to a gigabyte) lands there and goes with the test's
/// temporary directory ([`import_cache`]), and it is always made by the code under test.
pub fn worker_with_cache(cache: &Path) -> Client {
    worker_in(cache, &[])
}

/// Starts `mlx-worker` with `args` and `cache` as its cache directory (`MLX_WORKER_CACHE`).
pub fn worker_in(cache: &Path, args: &[&str]) -> Client {
    let mut command = worker_command(args);
    command.env("MLX_WORKER_CACHE", cache);
    spawn(command)
}

/// A temporary cache for [`worker_with_cache`], under Cargo's temporary directory for
/// integration tests (on the target's disk, not a RAM-backed `/tmp`).
pub fn import_cache() -> tempfile::TempDir {
    tempfile::TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn worker_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"));
    command.args(args).env("MLX_WORKER_LOG", "debug");
    command
}

fn spawn(command: tokio::process::Command) -> Client {
    let options = ClientOptions {
        echo_stderr: std::env::var_os("ECHO_WORKER_STDERR").is_some(),
        ..Default::default()
    };
    Client::spawn_command(command, options).expect("start mlx-worker")
}

/// `mlx-worker` as a plain child process with piped stdin and stdout (stderr dropped), for
/// tests that need the raw pipes rather than a client.
pub fn raw_worker() -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start mlx-worker")
}

/// Awaits `f`, failing the test after 10 s.
pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    within_for(Duration::from_secs(10), f).await
}

/// Awaits `f`, failing the test after `limit`.
pub async fn within_for<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {limit:?}"))
}

/// A directory holding a tiny random Llama written by `spec`.
pub fn tiny_model(spec: &TinyLlama) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_tiny_llama(dir.path(), spec).expect("write a tiny model");
    dir
}

/// The path as the `model` param.
pub fn model_id(dir: &Path) -> String {
    dir.display().to_string()
}

/// A worker with a tiny model (seed 0) loaded, and the model's directory.
pub async fn worker_with_tiny_model(args: &[&str]) -> (Client, tempfile::TempDir) {
    let dir = tiny_model(&TinyLlama::default());
    let w = worker(args);
    let loaded = within(w.call::<Load>(&LoadParams::new(model_id(dir.path()))))
        .await
        .expect("load the tiny model");
    assert_eq!(loaded.model_id, model_id(dir.path()));
    (w, dir)
}

/// A greedy request for one user message.
/// Whether the machine's BLAS gives a row of a product the bits it gets alone
/// (`MLX_WORKER_BLAS_ROWS_EXACT`, which `cargo xtask test` measures; absent: yes). Where it does
/// not (OpenBLAS's SkylakeX kernels, docs/traps.md), a batched row is as alone in its tokens up
/// to near ties, as on a GPU, and the bit-for-bit checks would test the BLAS, not the worker.
pub fn blas_rows_exact() -> bool {
    std::env::var("MLX_WORKER_BLAS_ROWS_EXACT").map_or(true, |v| v != "0")
}

/// `status` once the generations answered so far have left the engine: a `status` is answered
/// from what the engine published after its last job, and a generation's response may come
/// just before that (a `cache_list`, itself a job, waits for it).
pub async fn settled_status(w: &Client) -> protocol::methods::StatusResult {
    use protocol::methods::{CacheList, CacheListParams, Status, StatusParams};
    within(w.call::<CacheList>(&CacheListParams::default()))
        .await
        .unwrap();
    within(w.call::<Status>(&StatusParams {})).await.unwrap()
}

/// A greedy request for a chat of `(role, content)` turns.
pub fn chat(turns: &[(&str, &str)], max_new_tokens: u32) -> GenerateParams {
    let messages = turns
        .iter()
        .map(|(r, c)| ChatMessage::new(*r, *c))
        .collect();
    let mut p = GenerateParams::new(messages);
    p.max_new_tokens = max_new_tokens;
    p.sampling.temperature = 0.0;
    p
}

pub fn greedy(content: &str, max_new_tokens: u32) -> GenerateParams {
    let mut p = GenerateParams::new(vec![ChatMessage::new("user", content)]);
    p.max_new_tokens = max_new_tokens;
    p.sampling.temperature = 0.0;
    p
}

/// The JSON-RPC error of a failed call, checked to carry `code`.
pub fn rpc_error<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
    code: ErrorCode,
) -> ResponseError {
    match result {
        Err(ClientError::Rpc(e)) => {
            assert_eq!(e.error_code(), Some(code), "{e:?}");
            e
        }
        other => panic!("expected error {code}, got {other:?}"),
    }
}

/// `n` workers joined as one group over MLX's ring backend on loopback, as `cargo xtask
/// launch` starts them: rank 0 behind a client, the other ranks plain children (killed when
/// dropped). Set ECHO_WORKER_STDERR=1 to see the followers' logs too.
pub struct Ranks {
    pub rank0: Client,
    pub followers: Vec<std::process::Child>,
    _hostfile: tempfile::TempPath,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for f in &mut self.followers {
            let _ = f.kill();
            let _ = f.wait();
        }
    }
}

/// Starts a group of `n` ranks (see [`Ranks`]).
pub fn ranks(n: usize) -> Ranks {
    ranks_with(n, &[])
}

/// Starts a group of `n` ranks, each with `args`.
pub fn ranks_with(n: usize, args: &[&str]) -> Ranks {
    ranks_where(n, args, None)
}

/// Starts a group of `n` ranks, each with `args`, rank 0 in `rank0_dir` when given.
pub fn ranks_where(n: usize, args: &[&str], rank0_dir: Option<&Path>) -> Ranks {
    // Free loopback ports, released just before the ranks bind them.
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    let hosts: Vec<Vec<String>> = listeners
        .iter()
        .map(|l| vec![l.local_addr().expect("bound").to_string()])
        .collect();
    drop(listeners);
    let mut hostfile = tempfile::NamedTempFile::new().expect("a hostfile");
    std::io::Write::write_all(
        &mut hostfile,
        serde_json::to_string(&hosts).unwrap().as_bytes(),
    )
    .expect("write the hostfile");
    let hostfile = hostfile.into_temp_path();
    let echo = std::env::var_os("ECHO_WORKER_STDERR").is_some();
    let followers = (1..n)
        .map(|rank| {
            std::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"))
                .args(args)
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(match echo {
                    true => std::process::Stdio::inherit(),
                    false => std::process::Stdio::null(),
                })
                .spawn()
                .expect("start a follower rank")
        })
        .collect();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"));
    if let Some(dir) = rank0_dir {
        command.current_dir(dir);
    }
    command
        .args(args)
        .env("MLX_RANK", "0")
        .env("MLX_HOSTFILE", &hostfile)
        .env("MLX_WORKER_LOG", "debug");
    let options = ClientOptions {
        echo_stderr: echo,
        ..Default::default()
    };
    Ranks {
        rank0: Client::spawn_command(command, options).expect("start rank 0"),
        followers,
        _hostfile: hostfile,
    }
}
