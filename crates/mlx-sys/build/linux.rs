//! Linux: mlx-c built against the prebuilt libmlx, OpenBLAS linked ahead of it.

use std::{
    env,
    path::{Path, PathBuf},
};

/// Builds `libmlxc.a`, emits the link lines, and returns extra clang args for bindgen.
pub fn build_and_link(mlx_c: &Path, dist: &Path) -> Vec<String> {
    let compat = compat_dir();
    let mut config = crate::dist::mlx_c_config(mlx_c, dist);
    config
        .cxxflag(format!(
            "-include {}",
            compat.join("format_compat.h").display()
        ))
        // Gives x86 the float16_t/bfloat16_t storage types mlx-c declares only on ARM.
        .cxxflag(format!("-include {}", compat.join("half_cxx.h").display()));
    let build = config.build().join("build");

    // OpenBLAS as a direct dependency of the binary comes before the wheel's reference BLAS (a
    // dependency of libmlx) in the loader's search order, so its cblas_sgemm wins: float32
    // matmuls ~11x faster on x86. `cpu_blas()` references it, which keeps it past --as-needed.
    if env::var_os("CARGO_FEATURE_CUDA").is_none() && openblas_present() {
        println!("cargo:rustc-link-lib=dylib=openblas");
        println!("cargo:rustc-cfg=mlx_sys_openblas");
    } else if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        println!(
            "cargo:warning=OpenBLAS not found: float32 matmuls will use the wheel's slow reference \
             BLAS. Install it with `apt-get install libopenblas-dev`"
        );
    }
    crate::dist::link(&build, dist, "stdc++");
    half_bindgen_args()
}

/// bindgen's extra args on a non-ARM host: `float16_t`/`bfloat16_t` as mlx-rs expects them.
pub fn half_bindgen_args() -> Vec<String> {
    vec![format!(
        "-include{}",
        compat_dir().join("half_bindgen.h").display()
    )]
}

fn compat_dir() -> PathBuf {
    PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("compat")
}

fn openblas_present() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .any(|d| Path::new(d).join("libopenblas.so").exists())
}
