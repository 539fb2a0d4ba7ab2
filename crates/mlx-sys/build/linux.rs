//! Linux: mlx-c built against the prebuilt libmlx, OpenBLAS linked ahead of it.

use std::{
    env, fs,
    path::{Path, PathBuf},
};

use crate::wheel;

/// Builds `libmlxc.a`, emits the link lines, and returns extra clang args for bindgen.
pub fn build_and_link(mlx_c: &Path, out_dir: &Path) -> Vec<String> {
    let dist = wheel::mlx_dist();
    publish_beside_binaries(&dist, out_dir);
    let compat = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("compat");

    let mut config = cmake::Config::new(mlx_c);
    config
        .profile("Release")
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_DIR", dist.join("mlx/share/cmake/MLX"))
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .cxxflag(format!(
            "-include {}",
            compat.join("format_compat.h").display()
        ))
        // Gives x86 the float16_t/bfloat16_t storage types mlx-c declares only on ARM.
        .cxxflag(format!("-include {}", compat.join("half_cxx.h").display()))
        .build_target("mlxc");
    let build = config.build().join("build");

    // OpenBLAS as a direct dependency of the binary comes before the wheel's reference BLAS (a
    // dependency of libmlx) in the loader's search order, so its cblas_sgemm wins: float32
    // matmuls ~11x faster on x86. `cpu_blas()` references it, which keeps it past --as-needed.
    println!("cargo::rustc-check-cfg=cfg(mlx_sys_openblas)");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() && openblas_present() {
        println!("cargo:rustc-link-lib=dylib=openblas");
        println!("cargo:rustc-cfg=mlx_sys_openblas");
    } else if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        println!(
            "cargo:warning=OpenBLAS not found: float32 matmuls will use the wheel's slow reference \
             BLAS. Install it with `apt-get install libopenblas-dev`"
        );
    }
    println!("cargo:rustc-link-search=native={}", build.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!(
        "cargo:rustc-link-search=native={}",
        dist.join("mlx/lib").display()
    );
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo::metadata=lib_dir={}", dist.join("mlx/lib").display());
    println!(
        "cargo::metadata=include={}",
        dist.join("mlx/include").display()
    );
    println!("cargo::metadata=version={}", wheel::MLX_VERSION);

    vec![format!(
        "-include{}",
        compat.join("half_bindgen.h").display()
    )]
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

/// Binaries carry the rpath `$ORIGIN/../mlx/mlx/lib` (see .cargo/config.toml): put the MLX
/// distribution at `<target dir>/mlx` so every binary and test of the workspace finds libmlx.
fn publish_beside_binaries(dist: &Path, out_dir: &Path) {
    // OUT_DIR is <target>/<profile>/build/mlx-sys-<hash>/out.
    let Some(target) = out_dir.ancestors().nth(4) else {
        return;
    };
    let link = target.join("mlx");
    if fs::read_link(&link).ok().as_deref() == Some(dist) {
        return;
    }
    let _ = fs::remove_file(&link);
    let _ = fs::remove_dir_all(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(dist, &link).expect("link the MLX distribution into the target dir");
}
