//! `cargo xtask launch --ranks N -- <worker args>`: a local group of workers joined over MLX's
//! ring backend on loopback, started the way `mlx.launch --backend ring -n N` starts them (the
//! same environment: `MLX_RANK`, and `MLX_HOSTFILE` naming a JSON list of each rank's
//! `ip:port`). Rank 0 takes this terminal's stdin and stdout (JSON-RPC, as a lone worker); the
//! other ranks' stdout is discarded, every rank's log goes to stderr. Ends with rank 0's exit
//! status, the others stopped then. For tests and debugging; across machines use `mlx.launch`.

use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::worker_bin;

#[derive(clap::Args)]
pub struct Options {
    /// Number of ranks (processes) in the group.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Run the debug worker (what `cargo test` builds) instead of the release one.
    #[arg(long)]
    debug: bool,
    /// Options for every rank's mlx-worker (after `--`).
    #[arg(last = true)]
    worker_args: Vec<String>,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if opts.ranks < 2 {
        bail!("a group needs at least 2 ranks (--ranks)");
    }
    let worker = match std::env::var_os("MLX_WORKER_BIN") {
        Some(bin) => bin.into(),
        None if opts.debug => worker_bin::build_debug()?,
        None => worker_bin::build_release()?,
    };
    let hostfile =
        std::env::temp_dir().join(format!("mlx-worker-hosts-{}.json", std::process::id()));
    std::fs::write(&hostfile, hosts(opts.ranks)?).context("writing the hostfile")?;
    eprintln!(
        "launch: {} ranks over ring on loopback ({})",
        opts.ranks,
        hostfile.display()
    );
    let rank = |r: usize| {
        let mut c = Command::new(&worker);
        c.args(&opts.worker_args)
            .env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile);
        c
    };
    let mut followers: Vec<Child> = (1..opts.ranks)
        .map(|r| rank(r).stdin(Stdio::null()).stdout(Stdio::null()).spawn())
        .collect::<Result<_, _>>()
        .context("starting the ranks")?;
    let status = rank(0).status().context("starting rank 0");
    stop(&mut followers);
    let _ = std::fs::remove_file(&hostfile);
    exit_with(status?)
}

/// The hostfile: one free loopback port per rank, in rank order.
pub(crate) fn hosts(n: usize) -> anyhow::Result<String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding free loopback ports")?;
    let hosts: Vec<Vec<String>> = listeners
        .iter()
        .map(|l| Ok(vec![l.local_addr()?.to_string()]))
        .collect::<std::io::Result<_>>()?;
    Ok(serde_json::to_string(&hosts)?)
}

/// Followers exit once rank 0 has (its `shutdown`, or the group's transport closing); any
/// still running after a few seconds are killed.
pub(crate) fn stop(followers: &mut [Child]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for f in followers {
        while f.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if f.try_wait().ok().flatten().is_none() {
            let _ = f.kill();
            let _ = f.wait();
        }
    }
}

fn exit_with(status: ExitStatus) -> anyhow::Result<()> {
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => bail!("rank 0 ended by a signal ({status})"),
    }
}
