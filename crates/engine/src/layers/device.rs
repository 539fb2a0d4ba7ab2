//! What MLX computes on: version, backend, device name and memory (MLX's `device_info`); the
//! thread's extra CPU streams (lanes); waiting for queued work.

use std::{
    cell::RefCell,
    ffi::{CStr, CString},
    sync::OnceLock,
};

use mlx_rs::{Device, Stream};
use mlx_sys as sys;

/// What MLX computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

/// The device MLX computes on.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub mlx_version: String,
    pub backend: Backend,
    pub name: String,
    pub memory_bytes: u64,
    pub recommended_working_set_bytes: Option<u64>,
    /// The BLAS behind float32 CPU matmuls.
    pub cpu_blas: String,
}

/// Reads the default device's description from MLX.
pub fn device_info() -> DeviceInfo {
    // SAFETY: plain mlx-c calls on objects created and freed here; strings are copied out
    // before the objects holding them are freed.
    unsafe {
        let mut version = sys::mlx_string_new();
        sys::mlx_version(&mut version);
        let mlx_version = CStr::from_ptr(sys::mlx_string_data(version))
            .to_string_lossy()
            .into_owned();
        sys::mlx_string_free(version);

        let (mut metal, mut cuda) = (false, false);
        sys::mlx_metal_is_available(&mut metal);
        sys::mlx_cuda_is_available(&mut cuda);
        let mut dev = sys::mlx_device_new();
        sys::mlx_get_default_device(&mut dev);
        let mut kind = sys::mlx_device_type__MLX_CPU;
        sys::mlx_device_get_type(&mut kind, dev);
        let on_gpu = kind == sys::mlx_device_type__MLX_GPU;
        let backend = backend_of(on_gpu, metal, cuda);
        let mut info = sys::mlx_device_info_new();
        let ok = sys::mlx_device_info_get(&mut info, dev) == 0;
        let size = |key: &str| -> Option<u64> {
            let key = CString::new(key).ok()?;
            let mut v = 0usize;
            (ok && sys::mlx_device_info_get_size(&mut v, info, key.as_ptr()) == 0)
                .then_some(v as u64)
        };
        let string = |key: &str| -> Option<String> {
            let key = CString::new(key).ok()?;
            let mut v: *const std::ffi::c_char = std::ptr::null();
            (ok && sys::mlx_device_info_get_string(&mut v, info, key.as_ptr()) == 0 && !v.is_null())
                .then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
        };
        let memory_bytes = size("memory_size")
            .or_else(|| size("total_memory"))
            .filter(|&m| m > 0)
            .unwrap_or_else(system_memory);
        let recommended = size("max_recommended_working_set_size");
        let name = string("device_name")
            .or_else(|| string("architecture"))
            .unwrap_or_else(|| format!("{backend:?}").to_lowercase());
        sys::mlx_device_info_free(info);
        sys::mlx_device_free(dev);

        DeviceInfo {
            mlx_version,
            backend,
            name,
            memory_bytes,
            recommended_working_set_bytes: recommended,
            cpu_blas: sys::cpu_blas(),
        }
    }
}

/// Whether MLX computes on a GPU (Metal or CUDA), read once.
pub(crate) fn on_gpu() -> bool {
    static ON_GPU: OnceLock<bool> = OnceLock::new();
    *ON_GPU.get_or_init(|| device_info().backend != Backend::Cpu)
}

/// The backend the default device runs on. A GPU left unused is worth a warning: on a Mac
/// (Metal) or an NVIDIA machine (CUDA) the CPU is many times slower.
fn backend_of(on_gpu: bool, metal: bool, cuda: bool) -> Backend {
    match (on_gpu, metal, cuda) {
        (true, true, _) => Backend::Metal,
        (true, false, true) => Backend::Cuda,
        (_, metal, cuda) => {
            if metal || cuda {
                tracing::warn!(
                    "MLX's default device is the CPU although this machine has a {} GPU: \
                     generation will be much slower than it should be",
                    if metal { "Metal" } else { "CUDA" }
                );
            } else if cfg!(target_os = "macos") {
                tracing::warn!(
                    "MLX finds no Metal device on this Mac (a virtual machine?): running on \
                     the CPU, much slower than on the GPU"
                );
            }
            Backend::Cpu
        }
    }
}

/// Physical memory from /proc/meminfo, for the CPU backend (MLX reports none there).
fn system_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// Waits until everything queued on this thread's default stream has run, and takes the error
/// MLX's stream thread stored meanwhile, if any. Arrays queued with `async_eval` and then
/// dropped are otherwise released later by MLX's stream thread, which races with process exit
/// (seen here: heap corruption in `exit` after a generation). And MLX 0.32.2 catches an exception
/// thrown by a task on its stream thread and keeps it on the stream (`Scheduler::enqueue` in
/// `mlx/scheduler.cpp`) until someone waits on work queued after it or MLX's main thread queues
/// more: a failed step that nobody read would otherwise fail the next request. A tiny
/// computation queued behind everything and waited on does both (`mlx_synchronize` alone may
/// throw that error away). The attention's extra CPU streams are probed too
/// ([`lanes`]); they belong to the thread that made them, so this runs on
/// the thread that runs MLX.
pub fn synchronize() -> Result<(), mlx_rs::error::Exception> {
    let probe = || {
        mlx_rs::Array::from_int(0)
            .add(mlx_rs::Array::from_int(0))?
            .eval()
    };
    let lanes = lanes();
    let lanes = lanes.iter().map(|lane| mlx_rs::with_stream(lane, probe));
    // Every stream is probed, and the first error returned.
    std::iter::once(probe())
        .chain(lanes)
        .fold(Ok(()), Result::and)
}

thread_local! {
    /// Extra CPU streams for the attention's head groups (`sdpa.rs`) (each its own MLX thread),
    /// made on first use by the thread running MLX.
    static STREAMS: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` (which queues MLX ops) on CPU lane `lane`: lane 0 is the caller's stream, each
/// other a CPU stream of its own, made once per thread (`lane < cores()`).
pub(crate) fn in_lane<T>(lane: usize, f: impl FnOnce() -> T) -> T {
    if lane == 0 {
        return f();
    }
    let stream = STREAMS.with(|s| {
        let mut s = s.borrow_mut();
        while s.len() < lane {
            s.push(Stream::new_with_device(&Device::cpu()));
        }
        s[lane - 1].clone()
    });
    mlx_rs::with_stream(&stream, f)
}

/// The lanes this thread has made (`device::synchronize` probes each: a failure in the graph
/// a lane waited on poisons the lane too, MLX 0.32.2 passing errors along events, and the lane
/// would throw it at the next request's first split).
pub(crate) fn lanes() -> Vec<Stream> {
    STREAMS.with(|s| s.borrow().clone())
}

/// The cores MLX's CPU streams can run on, read once.
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_is_the_default_devices() {
        // (default device is a GPU, Metal available, CUDA available)
        assert_eq!(backend_of(true, true, false), Backend::Metal);
        assert_eq!(backend_of(true, false, true), Backend::Cuda);
        assert_eq!(backend_of(false, false, false), Backend::Cpu);
        // A GPU left unused is reported as what runs: the CPU (and a warning is logged).
        assert_eq!(backend_of(false, true, false), Backend::Cpu);
        assert_eq!(backend_of(false, false, true), Backend::Cpu);
    }
}
