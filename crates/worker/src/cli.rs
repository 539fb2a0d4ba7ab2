//! Command-line options.

use clap::Parser;

/// mlx-worker: MLX inference behind JSON-RPC 2.0 on stdin/stdout, one message per line.
/// Logs go to stderr; set the level with MLX_WORKER_LOG (or RUST_LOG), default `info`.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Longest accepted input line in bytes; longer lines are discarded with -32600.
    #[arg(long, default_value_t = protocol::DEFAULT_MAX_LINE_BYTES, value_parser = parse_positive)]
    pub max_line_bytes: usize,

    /// Most load/generate/unload/reset requests that may wait for the engine; past it -32003.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,

    /// Most generate requests that run together, one forward pass per decode step serving them
    /// all (continuous batching); 1 runs one at a time. See protocol.md's Transport section.
    #[arg(long, default_value_t = 1, value_parser = parse_positive)]
    pub max_batch: usize,

    /// How the rows of a batch attend: `rows` (each over its own cache), `padded` (over one
    /// padded cache: one cache write per layer and step for all rows; on the CPU every
    /// request's tokens stay bit for bit those `rows` gives, which are those it gets alone; on a
    /// GPU one attention call per layer and one prefill pass for requests arriving together,
    /// so the last bits of a row may differ), `auto` (padded).
    #[arg(long, value_enum, default_value_t = BatchAttentionArg::Auto)]
    pub batch_attention: BatchAttentionArg,

    /// Bytes of KV caches the active model keeps for the next turns of recent conversations
    /// (least recently used dropped first; the newest is always kept). 0 keeps only the newest.
    #[arg(long, default_value_t = mlx_engine::DEFAULT_PROMPT_CACHE_BYTES)]
    pub prompt_cache_bytes: u64,

    /// Bytes of conversations' KV caches kept on disk (`<cache root>/prompt-cache`, the cache
    /// root being MLX_WORKER_CACHE or the user's cache directory): caches leaving memory (pushed
    /// out by newer ones, at unload and exit) are written there and read back by a prompt that
    /// shares their prefix, after a restart too. 0 (the default) turns the disk tier off. Also
    /// read from MLX_WORKER_DISK_CACHE_BYTES.
    #[arg(long, env = "MLX_WORKER_DISK_CACHE_BYTES", default_value_t = 0)]
    pub disk_cache_bytes: u64,

    /// Most bytes the disk tier writes in any hour (SSD wear); past it, caches leaving memory
    /// are dropped. Default: four times --disk-cache-bytes.
    #[arg(long)]
    pub disk_cache_write_bytes_per_hour: Option<u64>,

    /// MLX's memory limit in bytes: what `load` fits a model's context to and `generate` admits
    /// requests within (protocol-additions.md). Default: 85% of the device's memory (Metal:
    /// of its recommended working set). Also read from MLX_WORKER_MEMORY_LIMIT, for hosts that
    /// start the worker without arguments of their own.
    #[arg(long, env = "MLX_WORKER_MEMORY_LIMIT", value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_limit: Option<u64>,

    /// In a group of ranks (rank 0): seconds a generate, unload or reset may go without word
    /// from the other ranks before the group counts as broken and requests are answered with
    /// an error (loads are not watched).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub group_timeout_secs: u64,
}

impl Cli {
    /// What the engine is started with.
    pub fn settings(&self) -> crate::worker_engine::Settings {
        crate::worker_engine::Settings {
            prompt_cache_bytes: self.prompt_cache_bytes,
            memory_limit: self.memory_limit,
            batch_attention: self.batch_attention.engine(),
            disk_cache: self.disk_cache(),
        }
    }

    /// The disk tier's settings; `None` when it is off (or no cache root can be found).
    fn disk_cache(&self) -> Option<mlx_engine::DiskSettings> {
        if self.disk_cache_bytes == 0 {
            return None;
        }
        let root = model_store::cache_root()
            .inspect_err(|e| tracing::warn!("the disk tier of the prompt cache is off: {e}"))
            .ok()?;
        Some(mlx_engine::DiskSettings {
            dir: root.join("prompt-cache"),
            bytes: self.disk_cache_bytes,
            write_bytes_per_hour: (self.disk_cache_write_bytes_per_hour)
                .unwrap_or(self.disk_cache_bytes.saturating_mul(4)),
        })
    }
}

/// `--batch-attention`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BatchAttentionArg {
    Auto,
    Rows,
    Padded,
}

impl BatchAttentionArg {
    /// The engine's setting; `None` leaves the engine's default.
    pub fn engine(self) -> Option<mlx_engine::BatchAttention> {
        match self {
            Self::Auto => None,
            Self::Rows => Some(mlx_engine::BatchAttention::Rows),
            Self::Padded => Some(mlx_engine::BatchAttention::Padded),
        }
    }
}

fn parse_positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
