//! `mlx-worker`: Unsloth Studio's MLX inference child process. JSON-RPC 2.0 on stdin/stdout
//! (see protocol.md); logs on stderr.
//!
//! The path of a request: `transport` (stdin lines -> messages) -> `dispatcher` (answered at
//! once, or queued) -> `executor` (the one MLX thread: `generations` admits generate jobs to
//! the engine's scheduler, `worker_engine` runs load, unload and reset; both with `convert` and
//! `errors`) -> `transport` (stdout, one line per message). `residents` is what the dispatcher knows of the engine's models between jobs.

mod cli;
mod convert;
mod dispatcher;
mod errors;
mod executor;
mod generations;
mod group;
mod queue;
mod residents;
mod transport;
mod watchdog;
mod worker_engine;

use std::time::Duration;

use clap::Parser;
use tokio::sync::mpsc;
use tracing_subscriber::EnvFilter;

use crate::dispatcher::Dispatcher;
use crate::executor::Executor;
use crate::residents::SharedResidents;

/// The most threads tokio's blocking pool may hold (`tests/soak.rs` checks the bound).
const MAX_BLOCKING_THREADS: usize = 8;

fn main() {
    let cli = cli::Cli::parse();
    init_logging();
    if group::is_follower() {
        // Ranks other than 0 speak no protocol: they run what rank 0 shares (`group.rs`).
        std::process::exit(group::follow(&cli.settings()));
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        max_queue = cli.max_queue,
        max_batch = cli.max_batch,
        batch_attention = ?cli.batch_attention,
        max_line_bytes = cli.max_line_bytes,
        prompt_cache_bytes = cli.prompt_cache_bytes,
        memory_limit = ?cli.memory_limit,
        "mlx-worker starting"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // The blocking pool runs stdin's and stdout's I/O (one operation each at a time) and
        // `tokenize`; bounded, so the thread count of a long session is too (idle ones exit).
        .max_blocking_threads(MAX_BLOCKING_THREADS)
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
    let (outbox, stdout_gone) = transport::spawn_writer();
    let (events_tx, events) = mpsc::unbounded_channel();
    let residents = SharedResidents::default();
    let executor = Executor::spawn(
        outbox.clone(),
        events_tx,
        residents.clone(),
        cli.settings(),
        cli.max_batch,
        Duration::from_secs(cli.group_timeout_secs),
    );
    let inbound = transport::spawn_reader(cli.max_line_bytes, outbox.clone());
    Dispatcher::new(outbox, executor, residents, cli.max_queue, cli.max_batch)
        .run(inbound, events, stdout_gone)
        .await;
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
