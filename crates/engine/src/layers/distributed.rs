//! MLX's distributed layer: the group of processes (ranks) that MLX's launcher starts, and the
//! collectives the engine uses over it. mlx-rs 0.33 has no distributed API, so this reaches
//! mlx-c through mlx-sys (as `quantized.rs` does for what mlx-rs lacks), in one place.
//!
//! Which backend a rank joins follows from the environment `mlx.launch` (or `cargo xtask
//! launch`) sets: `MLX_HOSTFILE` ring, `MLX_JACCL_COORDINATOR` jaccl, `NCCL_HOST_IP` nccl, an
//! MPI launcher's `OMPI_COMM_WORLD_SIZE` mpi. Without any of them the worker is one process.

use std::ffi::CStr;
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use std::time::{SystemTime, UNIX_EPOCH};

use mlx_rs::{error::Exception, Array, Dtype};

use crate::layers::array::Result;

/// A distributed backend of MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP between neighbours of a ring (CPUs; Macs over Ethernet or Thunderbolt).
    Ring,
    /// RDMA over Thunderbolt (Macs).
    Jaccl,
    /// NVIDIA's collectives (CUDA).
    Nccl,
    /// An MPI installation.
    Mpi,
}

impl Backend {
    /// The backend the launcher's environment variables name, if any.
    pub fn from_env() -> Option<Backend> {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        if set("MLX_JACCL_COORDINATOR") || set("MLX_IBV_DEVICES") {
            Some(Backend::Jaccl)
        } else if set("NCCL_HOST_IP") {
            Some(Backend::Nccl)
        } else if set("MLX_HOSTFILE") && set("MLX_RANK") {
            Some(Backend::Ring)
        } else if set("OMPI_COMM_WORLD_SIZE") {
            Some(Backend::Mpi)
        } else {
            None
        }
    }

    /// MLX's name for it.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("ASCII")
    }

    fn c_name(self) -> &'static CStr {
        match self {
            Backend::Ring => c"ring",
            Backend::Jaccl => c"jaccl",
            Backend::Nccl => c"nccl",
            Backend::Mpi => c"mpi",
        }
    }
}

/// This process's place in a group of ranks, and the collectives over it. Lives on the MLX
/// thread, as every MLX object does.
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
    backend: Backend,
    rank: usize,
    size: usize,
    /// When the ranks last answered each other (ms since the Unix epoch): set by the
    /// collectives the engine waits on between steps ([`Group::any`], sharing, gathering).
    heard: Arc<AtomicU64>,
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl Group {
    /// Joins the group the environment describes; `Ok(None)` when there is none or it has one
    /// rank. Blocks until every rank has joined (the ring backend connects to its neighbours).
    pub fn from_env() -> std::result::Result<Option<Group>, String> {
        let Some(backend) = Backend::from_env() else {
            return Ok(None);
        };
        // SAFETY: `available` only reads the NUL-terminated name; `init` writes a new group
        // handle into `raw`, which this struct owns and frees once.
        if !unsafe { mlx_sys::mlx_distributed_is_available(backend.c_name().as_ptr()) } {
            return Err(format!(
                "this MLX build has no `{}` distributed backend",
                backend.name()
            ));
        }
        let mut raw = unsafe { mlx_sys::mlx_distributed_group_new() };
        let status =
            unsafe { mlx_sys::mlx_distributed_init(&mut raw, true, backend.c_name().as_ptr()) };
        if status != 0 || raw.ctx.is_null() {
            return Err(format!(
                "could not join the `{}` group the environment describes (MLX_RANK, MLX_HOSTFILE \
                 ...): is every rank started, and are the addresses right?",
                backend.name()
            ));
        }
        // SAFETY: `raw` is a valid group from here on.
        let (rank, size) = unsafe {
            (
                mlx_sys::mlx_distributed_group_rank(raw),
                mlx_sys::mlx_distributed_group_size(raw),
            )
        };
        let group = Group {
            raw,
            backend,
            rank: rank as usize,
            size: size as usize,
            heard: Arc::new(AtomicU64::new(now_ms())),
        };
        Ok((group.size > 1).then_some(group))
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// When the ranks last answered each other, in ms since the Unix epoch; shared with other
    /// threads, which may [`touch`](Group::touch) it too (a watchdog's clock).
    pub fn heard(&self) -> Arc<AtomicU64> {
        self.heard.clone()
    }

    /// Restarts the clock of [`Group::heard`] (a new request begins).
    pub fn touch(&self) {
        self.heard.store(now_ms(), Ordering::Release);
    }

    /// The sum of `x` over all ranks, on every rank.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        self.call("all_sum", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.raw, s)
        })
    }

    /// Every rank's `x`, concatenated along the first axis in rank order, on every rank.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        self.call("all_gather", |res, s| unsafe {
            mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.raw, s)
        })
    }

    /// Sends `x` to rank `dst`; the result stands for the sent array in the graph (evaluating
    /// it performs the send).
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        self.call("send", |res, s| unsafe {
            mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.raw, s)
        })
    }

    /// An array of `like`'s shape and dtype received from rank `src`.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        self.call("recv", |res, s| unsafe {
            mlx_sys::mlx_distributed_recv_like(res, like.as_ptr(), src as i32, self.raw, s)
        })
    }

    /// Whether `flag` is set on any rank (every rank must ask, in the same order).
    pub fn any(&self, flag: bool) -> Result<bool> {
        let sum = self.all_sum(&Array::from_slice(&[flag as i32], &[1]))?;
        sum.eval()?;
        self.touch();
        Ok(sum.as_slice::<i32>()[0] > 0)
    }

    /// Rank 0's `bytes` on every rank (the others pass `None`; every rank must call).
    pub fn share_bytes(&self, bytes: Option<&[u8]>) -> Result<Vec<u8>> {
        let bytes = if self.rank == 0 {
            bytes.unwrap_or(&[])
        } else {
            &[]
        };
        let len = self.all_sum(&Array::from_slice(&[bytes.len() as i64], &[1]))?;
        len.eval()?;
        let len = len.as_slice::<i64>()[0] as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        let mine = match self.rank {
            0 => Array::from_slice(bytes, &[len as i32]),
            _ => mlx_rs::ops::zeros_dtype(&[len as i32], Dtype::Uint8)?,
        };
        let all = self.all_sum(&mine)?;
        all.eval()?;
        self.touch();
        Ok(all.as_slice::<u8>().to_vec())
    }

    /// Every rank's `bytes`, by rank (every rank must call).
    pub fn gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lens = self.all_gather(&Array::from_slice(&[bytes.len() as i64], &[1]))?;
        lens.eval()?;
        let lens: Vec<usize> = lens.as_slice::<i64>().iter().map(|&n| n as usize).collect();
        let longest = lens.iter().copied().max().unwrap_or(0).max(1);
        let mut padded = bytes.to_vec();
        padded.resize(longest, 0);
        let all = self.all_gather(&Array::from_slice(&padded, &[longest as i32]))?;
        all.eval()?;
        self.touch();
        let all = all.as_slice::<u8>();
        let part = |(i, &n): (usize, &usize)| all[i * longest..i * longest + n].to_vec();
        Ok(lens.iter().enumerate().map(part).collect())
    }

    /// Runs one mlx-c collective into a new array: on the GPU's stream for NCCL, on the CPU's
    /// for the others (their transports run on the CPU, as MLX places them itself when no
    /// stream is given).
    fn call(
        &self,
        op: &str,
        f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array> {
        // SAFETY: plain constructors of handles this function frees (the stream) or owns
        // (the array, handed to `Array`, which frees it).
        let stream = unsafe {
            match self.backend {
                Backend::Nccl => mlx_sys::mlx_default_gpu_stream_new(),
                _ => mlx_sys::mlx_default_cpu_stream_new(),
            }
        };
        let mut res = unsafe { mlx_sys::mlx_array_new() };
        let status = f(&mut res, stream);
        unsafe { mlx_sys::mlx_stream_free(stream) };
        let out = unsafe { Array::from_ptr(res) };
        match status {
            0 => Ok(out),
            _ => Err(Exception::custom(format!(
                "MLX distributed {op} over the {} group failed",
                self.backend.name()
            ))),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `mlx_distributed_init` and is freed once, here.
        unsafe { mlx_sys::mlx_distributed_group_free(self.raw) };
    }
}
