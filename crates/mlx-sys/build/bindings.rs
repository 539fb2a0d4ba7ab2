//! Rust bindings for every header under mlx-c's `mlx/c`.

use std::{fs, path::Path};

pub fn generate(mlx_c: &Path, extra_clang_args: &[String], out: &Path) {
    let mut headers: Vec<_> = fs::read_dir(mlx_c.join("mlx/c"))
        .expect("read mlx-c's header directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let builder = bindgen::Builder::default()
        .rust_target("1.73.0".parse().expect("a valid rust target"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        .clang_args(extra_clang_args)
        // bindgen's `c_ulong` sizes trip rustc's suspicious_runtime_symbol_definitions lint.
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    headers
        .iter()
        .fold(builder, |b, h| b.header(h.to_string_lossy()))
        .generate()
        .unwrap_or_else(|e| {
            crate::fail(&format!(
                "mlx-sys: bindgen failed: {e}. It needs libclang: `apt-get install libclang-dev`"
            ))
        })
        .write_to_file(out)
        .expect("write bindings.rs");
}
