//! With the `cuda` feature, the binary links against MLX's CUDA libmlx, which needs the NVIDIA
//! driver's `libcuda.so.1`. A machine that builds but has no driver (CI, a cross build for a GPU
//! host) lacks it, and GNU ld refuses a shared library whose dependencies it cannot resolve; the
//! loader resolves them where the binary runs (the driver's library, the NVIDIA wheels beside
//! libmlx: `pypi::cuda`), so the link does not insist.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-link-arg-bins=-Wl,--allow-shlib-undefined");
    }
}
