//! Linux: mlx-c built against the prebuilt libmlx, OpenBLAS linked ahead of it.

use std::{
    env,
    path::{Path, PathBuf},
};

/// Builds `libmlxc.a`, emits the link lines, and returns extra clang args for bindgen.
pub fn build_and_link(mlx_c: &Path, dist: &Path) -> Vec<String> {
    let compat = compat_dir();
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let package = if cuda {
        headers_only_package(dist)
    } else {
        crate::dist::cmake_package(dist)
    };
    let mut config = crate::dist::mlx_c_config(mlx_c, &package);
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
    if !cuda && openblas_present() {
        println!("cargo:rustc-link-lib=dylib=openblas");
        println!("cargo:rustc-cfg=mlx_sys_openblas");
    } else if !cuda {
        println!(
            "cargo:warning=OpenBLAS not found: float32 matmuls will use the wheel's slow reference \
             BLAS. Install it with `apt-get install libopenblas-dev`"
        );
    }
    crate::dist::link(&build, dist, "stdc++");
    half_bindgen_args()
}

/// A CMake package for MLX's CUDA build that gives mlx-c what it compiles against (the headers,
/// C++20) and nothing more. The wheel's own `MLXConfig.cmake` calls
/// `find_dependency(CUDAToolkit REQUIRED)`, which fails without a CUDA toolkit, and the static
/// `mlxc` needs nothing from one (the CUDA and CPU wheels ship identical headers).
fn headers_only_package(dist: &Path) -> PathBuf {
    let dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("mlx-cmake");
    let config = format!(
        "# Written by mlx-sys's build script (build/linux.rs): MLX's CUDA build, headers only.\n\
         add_library(mlx SHARED IMPORTED)\n\
         set_target_properties(mlx PROPERTIES\n  \
         IMPORTED_LOCATION \"{lib}\"\n  \
         INTERFACE_INCLUDE_DIRECTORIES \"{include}\"\n  \
         INTERFACE_COMPILE_FEATURES \"cxx_std_20\")\n\
         set(MLX_FOUND TRUE)\n",
        lib = dist.join("mlx/lib/libmlx.so").display(),
        include = dist.join("mlx/include").display(),
    );
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/mlx-cmake");
    std::fs::write(dir.join("MLXConfig.cmake"), config).expect("write OUT_DIR/mlx-cmake");
    dir
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
