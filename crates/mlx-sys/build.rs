//! Builds mlx-c and generates the bindings mlx-rs expects.
//!
//! * Linux: links the prebuilt MLX 0.32.2 from PyPI (`mlx-cpu`, or `mlx-cuda-13` with the `cuda`
//!   feature), found through `MLX_DIR` or fetched into a cache, and builds mlx-c against it.
//! * macOS: upstream's build (MLX fetched and built by mlx-c's CMake, with Metal and Accelerate).
//!
//! mlx-c's source comes from the published `mlx-sys 0.7.0` crate, unpacked by `cargo vendor`.

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/linux.rs"]
mod linux;
#[path = "build/macos.rs"]
mod macos;
#[path = "build/mlx_c_source.rs"]
mod mlx_c_source;
#[path = "build/wheel.rs"]
mod wheel;

use std::{env, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=compat");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mlx_c = mlx_c_source::unpack(&out_dir);

    let extra_clang_args = match env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("macos") => {
            macos::build_and_link(&mlx_c);
            Vec::new()
        }
        Ok("linux") => linux::build_and_link(&mlx_c, &out_dir),
        Ok(other) => fail(&format!(
            "mlx-sys: unsupported target OS `{other}`; MLX runs on macOS (Metal) and Linux (CPU, CUDA)"
        )),
        Err(_) => fail("mlx-sys: CARGO_CFG_TARGET_OS is not set; run through cargo"),
    };
    bindings::generate(&mlx_c, &extra_clang_args, &out_dir.join("bindings.rs"));
}

/// Stops the build with a message that says what to do.
fn fail(message: &str) -> ! {
    eprintln!("\nerror: {message}\n");
    std::process::exit(1);
}
