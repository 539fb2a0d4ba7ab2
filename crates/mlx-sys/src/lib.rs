//! Raw bindings to mlx-c, the C API of MLX, for mlx-rs.
//!
//! This crate takes the published `mlx-sys 0.7.0`'s place (`[patch.crates-io]`) so that mlx-rs
//! builds against the prebuilt MLX from PyPI on every platform (Metal on macOS, CPU or CUDA on
//! Linux). See build.rs for where MLX comes from.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// mlx-rs seeds its default random state from `mach_approximate_time`, which only macOS has.
/// On other systems this supplies it: nanoseconds of the wall clock, which is all a seed needs.
#[cfg(not(target_os = "macos"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Names the BLAS that serves MLX's float32 CPU matmuls, e.g. `OpenBLAS 0.3.21 ...`.
///
/// On Linux the build links OpenBLAS (when installed) ahead of the reference BLAS that the MLX
/// wheel bundles; a binary that calls this function keeps that link, and with it the speed.
pub fn cpu_blas() -> String {
    #[cfg(mlx_sys_openblas)]
    {
        extern "C" {
            fn openblas_get_config() -> *const std::ffi::c_char;
        }
        // SAFETY: OpenBLAS returns a pointer to a static NUL-terminated string.
        let config = unsafe { std::ffi::CStr::from_ptr(openblas_get_config()) };
        format!("OpenBLAS {}", config.to_string_lossy().trim())
    }
    #[cfg(all(not(mlx_sys_openblas), target_os = "macos"))]
    {
        String::from("Accelerate")
    }
    #[cfg(all(not(mlx_sys_openblas), not(target_os = "macos")))]
    {
        String::from("bundled with MLX")
    }
}
