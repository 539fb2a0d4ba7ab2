//! Running as one rank of a group (MLX's distributed layer; protocol.md's "Groups of ranks").
//!
//! Rank 0 is the worker a host talks to: JSON-RPC on stdio as ever. Before its MLX thread runs
//! a queued request, it shares the request with the other ranks; they (followers) have no
//! protocol at all and run what rank 0 shares, in the same order, with the same engine code,
//! so every rank reaches the same collectives inside the model at the same step.
//!
//! The sharing goes through MLX's own collectives (`Group::share_bytes`: a broadcast written
//! as a sum to which only rank 0 contributes), not a channel of our own: the group's transport
//! already connects the ranks, and a request shared there is ordered with the model's
//! collectives by construction. A rank that dies breaks that transport for all: the others'
//! next collective fails (MLX reports "connection to a peer was lost"), rank 0 answers every
//! request from then on with an error, and followers exit.

use mlx_engine::{CancelToken, DistributedBackend, Group};
use protocol::methods::{GenerateParams, LoadParams, UnloadParams};
use serde::{Deserialize, Serialize};

use crate::convert;
use crate::errors::engine_error;
use crate::executor::{CacheCall, Work};
use crate::worker_engine::{Settings, WorkerEngine};

/// What rank 0 shares with the followers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Shared {
    Load(Box<LoadParams>),
    Generate(Box<GenerateParams>),
    Unload(UnloadParams),
    Reset(bool),
    Cache(CacheCall),
    /// Rank 0 is stopping: followers free their models and exit.
    Quit,
}

impl Shared {
    /// The request as followers get it: without the hub token, which never leaves rank 0 (each
    /// rank finds models on its own disk, or with its own hub login).
    pub fn of(work: &Work) -> Shared {
        match work {
            Work::Load(p) => Shared::Load(Box::new(LoadParams {
                hf_token: None,
                ..(**p).clone()
            })),
            Work::Generate(p) => Shared::Generate(p.clone()),
            Work::Unload(p) => Shared::Unload(p.clone()),
            Work::Reset { prompt_cache } => Shared::Reset(*prompt_cache),
            Work::Cache(call) => Shared::Cache(call.clone()),
        }
    }
}

/// Whether this process is a rank other than 0 of a group the launcher's environment
/// describes (`MLX_RANK`, which `mlx.launch` sets for every backend, or MPI's rank).
pub fn is_follower() -> bool {
    let rank = ["MLX_RANK", "OMPI_COMM_WORLD_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse::<usize>().ok());
    DistributedBackend::from_env().is_some() && rank.is_some_and(|r| r != 0)
}

/// Rank 0: sends `shared` to every follower.
pub fn share(group: &Group, shared: &Shared) -> Result<(), String> {
    let bytes = serde_json::to_vec(shared).expect("requests serialise");
    group
        .share_bytes(Some(&bytes))
        .map(drop)
        .map_err(|e| broken(&e.to_string()))
}

fn receive(group: &Group) -> Result<Shared, String> {
    let bytes = group
        .share_bytes(None)
        .map_err(|e| broken(&e.to_string()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("rank 0 shared a request this rank cannot read: {e}"))
}

fn broken(detail: &str) -> String {
    format!(
        "the group of ranks is broken ({detail}): a rank has stopped; restart the worker's group"
    )
}

/// A follower's life: join the group, run what rank 0 shares until it quits or the group
/// breaks. Returns the exit code.
pub fn follow(settings: &Settings) -> i32 {
    let group = match Group::from_env() {
        Ok(Some(group)) => group,
        Ok(None) => {
            tracing::error!("the environment names a group of one: nothing to follow");
            return 2;
        }
        Err(reason) => {
            tracing::error!("{reason}");
            return 2;
        }
    };
    let rank = group.rank();
    tracing::info!(
        rank,
        size = group.size(),
        backend = group.backend().name(),
        "following rank 0"
    );
    let mut engine = WorkerEngine::new(settings, Some(group));
    let never = CancelToken::new();
    loop {
        let shared = match receive(engine.group().expect("joined above")) {
            Ok(shared) => shared,
            Err(reason) => {
                tracing::error!(rank, "{reason}");
                return 1;
            }
        };
        let outcome = match shared {
            Shared::Load(p) => engine.load(&p, &never, &mut |_, _, _, _| {}).map(drop),
            // What rank 0's `generations.rs` runs in a group: an admission of its own.
            Shared::Generate(p) => convert::generate_request(&p).and_then(|request| {
                (engine.engine_mut())
                    .generate(&request, &mut |_| {}, &never)
                    .map(drop)
                    .map_err(engine_error)
            }),
            Shared::Unload(p) => engine.unload(&p).map(drop),
            Shared::Reset(prompt_cache) => {
                engine.reset(prompt_cache);
                Ok(())
            }
            Shared::Cache(call) => engine.cache(call).map(drop),
            Shared::Quit => break,
        };
        if let Err(e) = outcome {
            tracing::warn!(rank, "{}", e.message);
        }
    }
    engine.free();
    0
}
