//! Builds mlx-c against PyPI's prebuilt MLX and generates the bindings mlx-rs expects.
//!
//! Every target links the MLX build that mlx-lm runs on the same machine (the wheel choice lives
//! in the `pypi` crate, `pypi::mlx`, where it is unit-tested):
//! * macOS arm64: `mlx-metal` (`libmlx.dylib` + `mlx.metallib`): Metal is always on, whatever
//!   features the crates above pass.
//! * Linux: `mlx-cpu`, or `mlx-cuda-13` with the `cuda` feature; OpenBLAS linked ahead.
//!
//! `MLX_DIR` names an MLX distribution to use instead (an unpacked wheel or a `site-packages`).
//! mlx-c's source comes from the published `mlx-sys 0.7.0` crate, unpacked by `cargo vendor`.

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/dist.rs"]
mod dist;
#[path = "build/linux.rs"]
mod linux;
#[path = "build/macos.rs"]
mod macos;
#[path = "build/mlx_c_source.rs"]
mod mlx_c_source;

use std::{env, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=compat");
    println!("cargo::rustc-check-cfg=cfg(mlx_sys_openblas)");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mlx_c = mlx_c_source::unpack(&out_dir);
    let target = dist::target();
    let wheel = target
        .wheel()
        .unwrap_or_else(|e| fail(&format!("mlx-sys: {e}")));

    let extra_clang_args = match target.os.as_str() {
        "macos" if macos::from_source() => {
            macos::build_from_source(&mlx_c);
            Vec::new()
        }
        "macos" => {
            let dist = dist::mlx_dist(&wheel, &out_dir);
            macos::build_and_link(&mlx_c, &dist, target.macos)
        }
        _ => {
            let dist = dist::mlx_dist(&wheel, &out_dir);
            linux::build_and_link(&mlx_c, &dist)
        }
    };
    bindings::generate(&mlx_c, &extra_clang_args, &out_dir.join("bindings.rs"));
}

/// Stops the build with a message that says what to do.
fn fail(message: &str) -> ! {
    eprintln!("\nerror: {message}\n");
    std::process::exit(1);
}
