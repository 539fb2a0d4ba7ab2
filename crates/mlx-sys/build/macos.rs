//! macOS: upstream mlx-sys's behaviour. mlx-c's CMake fetches and builds MLX with Metal and
//! Accelerate; the result links statically with the system frameworks.

use std::path::Path;

pub fn build_and_link(mlx_c: &Path) {
    let metal = std::env::var_os("CARGO_FEATURE_METAL").is_some();
    let mut config = cmake::Config::new(mlx_c);
    config
        .profile("Release")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("MLX_BUILD_METAL", if metal { "ON" } else { "OFF" })
        .define("MLX_BUILD_ACCELERATE", "ON");
    let dst = config.build();
    println!("cargo:rustc-link-search=native={}/lib", dst.display());
    println!("cargo:rustc-link-search=native={}/build/lib", dst.display());
    println!(
        "cargo:rustc-link-search=native={}/build/_deps/mlx-build",
        dst.display()
    );
    println!(
        "cargo:rustc-link-search=native={}/build/_deps/mlx-build/mlx/io",
        dst.display()
    );
    for lib in ["mlxc", "mlx", "gguflib"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    println!("cargo:rustc-link-lib=c++");
    println!("cargo:rustc-link-lib=dylib=objc");
    println!("cargo:rustc-link-lib=framework=Foundation");
    println!("cargo:rustc-link-lib=framework=Accelerate");
    if metal {
        println!("cargo:rustc-link-lib=framework=Metal");
    }
}
