//! macOS (Apple Silicon): mlx-c built against PyPI's `mlx-metal` wheel, the MLX build mlx-lm
//! uses on the same Mac. `libmlx.dylib` (install name `@rpath/libmlx.dylib`) is found through
//! the binary's rpath (.cargo/config.toml), and MLX loads `mlx.metallib` from the directory that
//! holds `libmlx.dylib`; nothing else needs shipping (libmlx needs system frameworks only).

use std::{env, path::Path};

/// Builds `libmlxc.a` and emits the link lines; returns extra clang args for bindgen.
///
/// On a host that is not a Mac (CI's `cargo xtask check-macos`, through cargo-zigbuild, whose
/// zig supplies macOS's C headers) there is no macOS SDK to compile mlx-c with: the wheel is
/// still fetched and verified, the bindings are made for the target, and linking is left
/// undone, which `cargo check` never needs. A warning says so.
pub fn build_and_link(mlx_c: &Path, dist: &Path, macos: Option<(u32, u32)>) -> Vec<String> {
    if !cfg!(target_os = "macos") {
        println!(
            "cargo:warning=mlx-sys: checking for macOS on a {} host: mlx-c is not compiled (no \
             macOS SDK here), so this build can be checked but not linked",
            env::consts::OS
        );
        // Apple's clang takes `__bf16` on arm64 as is; Debian's libclang wants the feature named.
        return vec!["-march=armv8.6-a+bf16".into()];
    }
    // mlx-c for the macOS the wheel was chosen for, not for the SDK's (newer) version, which
    // the C compiler would take otherwise: `libmlxc.a` must run wherever libmlx runs.
    let (major, minor) = macos.unwrap_or((14, 0));
    std::env::set_var("MACOSX_DEPLOYMENT_TARGET", format!("{major}.{minor}"));
    let build = crate::dist::mlx_c_config(mlx_c, &crate::dist::cmake_package(dist))
        .build()
        .join("build");
    crate::dist::link(&build, dist, "c++");
    Vec::new()
}

/// `MLX_SYS_FROM_SOURCE=1`: the fallback, upstream mlx-sys's way (MLX fetched from GitHub and
/// compiled with Metal by mlx-c's CMake, about ten minutes). For an MLX the wheel does not give.
pub fn from_source() -> bool {
    println!("cargo:rerun-if-env-changed=MLX_SYS_FROM_SOURCE");
    env::var("MLX_SYS_FROM_SOURCE").is_ok_and(|v| v == "1")
}

/// Upstream's build: MLX compiled from source with Metal and Accelerate, linked statically.
pub fn build_from_source(mlx_c: &Path) {
    let dst = cmake::Config::new(mlx_c)
        .profile("Release")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("MLX_BUILD_METAL", "ON")
        .define("MLX_BUILD_ACCELERATE", "ON")
        .build();
    for dir in [
        "lib",
        "build/lib",
        "build/_deps/mlx-build",
        "build/_deps/mlx-build/mlx/io",
    ] {
        println!("cargo:rustc-link-search=native={}/{dir}", dst.display());
    }
    for lib in ["mlxc", "mlx", "gguflib"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    for framework in ["Foundation", "Metal", "QuartzCore", "Accelerate"] {
        println!("cargo:rustc-link-lib=framework={framework}");
    }
}
