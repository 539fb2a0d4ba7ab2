//! The MLX distribution to link: `MLX_DIR`, or this target's PyPI wheel, fetched into the cache.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use pypi::mlx::{self, Target, Wheel, MLX_VERSION};

/// The target as cargo describes it to build scripts.
pub fn target() -> Target {
    let var = |name: &str| env::var(name).unwrap_or_default();
    let os = var("CARGO_CFG_TARGET_OS");
    Target {
        macos: (os == "macos").then(macos_version).flatten(),
        os,
        arch: var("CARGO_CFG_TARGET_ARCH"),
        cuda: env::var_os("CARGO_FEATURE_CUDA").is_some(),
    }
}

/// The macOS the binary must run on: `MACOSX_DEPLOYMENT_TARGET` when set, else this Mac's own
/// version (so the wheel is the one pip installs for mlx-lm here), else none (cross builds: the
/// oldest wheel, which runs on every supported Mac).
fn macos_version() -> Option<(u32, u32)> {
    println!("cargo:rerun-if-env-changed=MACOSX_DEPLOYMENT_TARGET");
    if let Ok(v) = env::var("MACOSX_DEPLOYMENT_TARGET") {
        return Some(mlx::parse_macos_version(&v).unwrap_or_else(|| {
            crate::fail(&format!(
                "mlx-sys: MACOSX_DEPLOYMENT_TARGET={v} is not a macOS version such as 14.0"
            ))
        }));
    }
    if !cfg!(target_os = "macos") {
        return None;
    }
    let out = Command::new("sw_vers")
        .arg("-productVersion")
        .output()
        .ok()?;
    mlx::parse_macos_version(&String::from_utf8_lossy(&out.stdout))
}

/// Returns the distribution root (holding `mlx/lib/<libmlx>`), its layout verified, and links it
/// into the target directory so binaries find it through their rpath.
pub fn mlx_dist(wheel: &Wheel, out_dir: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLX_WHEEL_INDEX");
    println!("cargo:rerun-if-env-changed=MLX_SYS_CACHE");
    let dist = match env::var_os("MLX_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let root = mlx::dist_root(&dir, wheel.backend).unwrap_or_else(|| {
                crate::fail(&format!(
                    "mlx-sys: MLX_DIR={} holds no mlx/lib/{}. Point it at an unpacked MLX \
                     {MLX_VERSION} wheel or a site-packages with `pip install {}=={MLX_VERSION}`, \
                     or unset it to let the build fetch the wheel",
                    dir.display(),
                    wheel.library(),
                    wheel.package,
                ))
            });
            mlx::verify_layout(&root, wheel.backend)
                .unwrap_or_else(|e| crate::fail(&format!("mlx-sys: MLX_DIR: {e}")));
            root
        }
        None => {
            let index = pypi::Index::new(
                env::var("MLX_WHEEL_INDEX").unwrap_or_else(|_| pypi::Index::PYPI.into()),
            );
            mlx::fetch_dist(wheel, &index, |_| {}).unwrap_or_else(|e| {
                crate::fail(&format!(
                    "mlx-sys: {e}.\nWithout network, install MLX and point MLX_DIR at it: \
                     `pip install --target DIR {}=={MLX_VERSION}` then `MLX_DIR=DIR cargo build`",
                    wheel.package
                ))
            })
        }
    };
    // A deleted cache must rebuild the link and the wheel, not leave binaries without libmlx.
    println!(
        "cargo:rerun-if-changed={}",
        dist.join("mlx/lib").join(wheel.library()).display()
    );
    publish_beside_binaries(&dist, out_dir);
    println!("cargo::metadata=lib_dir={}", dist.join("mlx/lib").display());
    println!(
        "cargo::metadata=include={}",
        dist.join("mlx/include").display()
    );
    println!("cargo::metadata=version={MLX_VERSION}");
    dist
}

/// Binaries carry the rpath `<exe dir>/../mlx/mlx/lib` (see .cargo/config.toml): put the MLX
/// distribution at `<target dir>/mlx` so every binary and test of the workspace finds libmlx.
fn publish_beside_binaries(dist: &Path, out_dir: &Path) {
    // OUT_DIR is <target>/<profile>/build/mlx-sys-<hash>/out, or with --target
    // <target>/<triple>/<profile>/build/mlx-sys-<hash>/out: the link goes beside <profile>/.
    let Some(profile_parent) = out_dir.ancestors().nth(4) else {
        return;
    };
    let link = profile_parent.join("mlx");
    if fs::read_link(&link).ok().as_deref() == Some(dist) {
        return;
    }
    let _ = fs::remove_file(&link);
    let _ = fs::remove_dir_all(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(dist, &link).expect("link the MLX distribution into the target dir");
}

/// mlx-c's CMake, set to build the static `mlxc` against the MLX CMake package in `package`
/// (the distribution's own, [`cmake_package`], where it can be used).
pub fn mlx_c_config(mlx_c: &Path, package: &Path) -> cmake::Config {
    let mut config = cmake::Config::new(mlx_c);
    config
        .profile("Release")
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_DIR", package)
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .build_target("mlxc");
    config
}

/// The distribution's CMake package, `mlx/share/cmake/MLX`.
pub fn cmake_package(dist: &Path) -> PathBuf {
    dist.join("mlx/share/cmake/MLX")
}

/// Links `libmlxc.a` (built in `build`), the distribution's libmlx, and the C++ runtime `cxx`.
pub fn link(build: &Path, dist: &Path, cxx: &str) {
    println!("cargo:rustc-link-search=native={}", build.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!(
        "cargo:rustc-link-search=native={}",
        dist.join("mlx/lib").display()
    );
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib={cxx}");
}
