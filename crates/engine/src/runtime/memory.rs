//! MLX memory: limits set on load (as the seed does), release on unload, and readings.

use crate::runtime::request::{DeviceInfo, MemoryStats};

/// Active, peak, limit and cache bytes as MLX reports them.
pub fn stats() -> MemoryStats {
    use mlx_rs::memory as m;
    MemoryStats {
        active_bytes: m::active_memory().unwrap_or(0) as u64,
        peak_bytes: m::peak_memory().unwrap_or(0) as u64,
        limit_bytes: m::memory_limit().unwrap_or(0) as u64,
        cache_bytes: m::cache_memory().unwrap_or(0) as u64,
    }
}

/// The share of the memory limit MLX's CPU allocator may keep as freed buffers for reuse.
///
/// Its default keeps 32 MB, so every larger buffer (a prefill chunk's attention scores, an
/// image encoder's: 1 GiB a layer for a 4096-patch SigLIP tower) is a fresh `malloc`, and the
/// kernel zeroes its pages again on first touch (a tenth to a fifth of a vision request's CPU
/// time here; docs/decisions/mlx-on-linux.md has the measurement). Metal's allocator keeps up
/// to the whole memory limit by default; the CPU gets a quarter. The engine empties the cache after each prefill chunk, after an image's features,
/// every 256 decode steps and on unload, so cached buffers live within one of those stretches.
const CPU_CACHE_SHARE: f64 = 0.25;

/// Caps MLX memory before weights are read: at `limit` when the host set one
/// (`--memory-limit`), else 85% of the recommended working set on Metal (and wires that much),
/// 85% of the device's memory elsewhere, as the seed backend did; on the CPU lets MLX cache
/// large freed buffers ([`CPU_CACHE_SHARE`]).
pub fn apply_limits(device: &DeviceInfo, limit: Option<u64>) {
    let base = device
        .recommended_working_set_bytes
        .unwrap_or(device.memory_bytes);
    let limit = match limit {
        Some(limit) => limit as usize,
        None if base == 0 => return,
        None => (base as f64 * 0.85) as usize,
    };
    if let Err(e) = mlx_rs::memory::set_memory_limit(limit) {
        tracing::warn!("set_memory_limit({limit}): {e}");
    }
    if device.backend == crate::Backend::Metal {
        if let Err(e) = mlx_rs::memory::set_wired_limit(limit) {
            tracing::warn!("set_wired_limit({limit}): {e}");
        }
    }
    if device.backend == crate::Backend::Cpu {
        let cache = (limit as f64 * CPU_CACHE_SHARE) as usize;
        if let Err(e) = mlx_rs::memory::set_cache_limit(cache) {
            tracing::warn!("set_cache_limit({cache}): {e}");
        }
    }
}

/// Frees MLX's buffer cache; releases the wired limit too once nothing is resident.
pub fn release(nothing_resident: bool) {
    if let Err(e) = mlx_rs::memory::clear_cache() {
        tracing::warn!("clear_cache: {e}");
    }
    if nothing_resident {
        let _ = mlx_rs::memory::set_wired_limit(0);
    }
}

/// MLX's memory limit in bytes (`None` when MLX does not say).
pub fn limit_bytes() -> Option<u64> {
    mlx_rs::memory::memory_limit()
        .ok()
        .map(|b| b as u64)
        .filter(|&b| b > 0)
}

/// Ends a generation whose buffers have grown past MLX's memory limit, while the process still
/// can: on the CPU nothing else would (MLX's CPU allocator neither enforces the limit nor
/// reports a failed allocation: the process would be killed or crash, docs/reliability.md).
/// `tokens`: how many of the request's tokens are in its cache so far.
pub(crate) fn check_headroom(tokens: usize) -> Result<(), crate::EngineError> {
    let (Ok(active), Some(limit)) = (mlx_rs::memory::active_memory(), limit_bytes()) else {
        return Ok(());
    };
    if active as u64 <= limit {
        return Ok(());
    }
    Err(crate::EngineError::Generation(format!(
        "MLX's memory in use ({:.2} GB) passed its limit ({:.2} GB) with {tokens} tokens in \
         this request's cache: ask for fewer tokens (a shorter prompt, a lower max_new_tokens) or \
         unload other models",
        active as f64 / 1e9,
        limit as f64 / 1e9
    )))
}
