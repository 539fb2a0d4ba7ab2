//! `mlx-worker`: Unsloth Studio's MLX inference child process. JSON-RPC 2.0 on stdin/stdout
//! (see protocol.md); logs on stderr.
//!
//! The path of a request: `transport` (stdin lines -> messages) -> `dispatcher` (answered at
//! once, or queued) -> `executor` (the one MLX thread, driving a `backend`) -> `transport`
//! (stdout, one line per message).

mod backend;
mod cli;
mod dispatcher;
mod executor;
#[cfg(feature = "fake-engine")]
mod fake_backend;
mod queue;
mod transport;
#[cfg(not(feature = "fake-engine"))]
mod unavailable;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use tokio::sync::mpsc;
use tracing_subscriber::EnvFilter;

use crate::backend::Residents;
use crate::dispatcher::Dispatcher;
use crate::executor::Executor;

fn main() {
    let cli = cli::Cli::parse();
    init_logging();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        max_queue = cli.max_queue,
        max_line_bytes = cli.max_line_bytes,
        "mlx-worker starting"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the tokio runtime");
    runtime.block_on(serve(cli));
    // The stdin reader may sit in a blocking read and the MLX thread in a long kernel: neither
    // may delay the exit the parent waits for.
    runtime.shutdown_timeout(Duration::from_millis(50));
    std::process::exit(0);
}

async fn serve(cli: cli::Cli) {
    let outbox = transport::spawn_writer();
    let (events_tx, events) = mpsc::unbounded_channel();
    let residents = Arc::new(Mutex::new(Residents::default()));
    let executor = Executor::spawn(make_backend, outbox.clone(), events_tx, residents.clone());
    let inbound = transport::spawn_reader(cli.max_line_bytes, outbox.clone());
    Dispatcher::new(outbox, executor, residents, cli.max_queue)
        .run(inbound, events)
        .await;
}

#[cfg(feature = "fake-engine")]
fn make_backend() -> Result<fake_backend::FakeBackend, String> {
    tracing::warn!("built with the fake engine: for tests only, no model runs");
    Ok(fake_backend::FakeBackend::default())
}

// TODO(engine): with feature `mlx`, build `engine_backend::EngineBackend` here.
#[cfg(not(feature = "fake-engine"))]
fn make_backend() -> Result<unavailable::Unavailable, String> {
    tracing::warn!("built without an inference engine: engine requests will fail");
    Ok(unavailable::Unavailable)
}

/// Logs to stderr only; the level comes from MLX_WORKER_LOG, then RUST_LOG, default `info`.
fn init_logging() {
    let filter = ["MLX_WORKER_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
