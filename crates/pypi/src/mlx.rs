//! Which MLX a target links, and what an unpacked MLX distribution must hold.
//!
//! Every platform uses the MLX build PyPI publishes, the very one mlx-lm runs on that machine:
//!
//! | target | wheel | library |
//! |---|---|---|
//! | macOS arm64 | `mlx-metal`, the newest `macosx_X_Y_arm64` not newer than the Mac (as pip picks) | `libmlx.dylib` + `mlx.metallib` |
//! | Linux x86_64 / aarch64 | `mlx-cpu`, `manylinux_2_35_<arch>` | `libmlx.so` |
//! | Linux x86_64 / aarch64, `cuda` feature | `mlx-cuda-13`, `manylinux_2_35_<arch>` | `libmlx.so` |
//!
//! Unpacked, a wheel holds `mlx/lib/<library>`, `mlx/include/mlx/mlx.h` and
//! `mlx/share/cmake/MLX/MLXConfig.cmake` (what mlx-c's CMake needs to build against it).

use std::path::{Path, PathBuf};

use crate::{Error, Index, Result, WheelFile};

/// The MLX release mlx-c 0.7.0 (and so mlx-rs 0.33) is built for; other releases' headers break it.
pub const MLX_VERSION: &str = "0.32.4";

/// The backend a target's MLX computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

/// What the build is for, as cargo tells a build script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `CARGO_CFG_TARGET_OS`: "macos", "linux", ...
    pub os: String,
    /// `CARGO_CFG_TARGET_ARCH`: "aarch64", "x86_64", ...
    pub arch: String,
    /// The `cuda` feature (Linux only).
    pub cuda: bool,
    /// macOS only: the oldest macOS the binary must run on, `(major, minor)`. `None` takes the
    /// oldest wheel, which runs on every Mac MLX supports.
    pub macos: Option<(u32, u32)>,
}

/// The wheel a target links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wheel {
    pub package: &'static str,
    pub backend: Backend,
    platform: Platform,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Platform {
    Manylinux { arch: &'static str },
    MacosArm64 { not_newer_than: Option<(u32, u32)> },
}

impl Target {
    pub fn wheel(&self) -> Result<Wheel> {
        let unsupported = |what: String| Err(Error::Unsupported(what));
        match (self.os.as_str(), self.arch.as_str()) {
            ("macos", "aarch64") if self.cuda => unsupported(
                "the `cuda` feature is for Linux with NVIDIA GPUs; on a Mac MLX runs on Metal, \
                 drop the feature"
                    .into(),
            ),
            ("macos", "aarch64") => Ok(Wheel {
                package: "mlx-metal",
                backend: Backend::Metal,
                platform: Platform::MacosArm64 {
                    not_newer_than: self.macos,
                },
            }),
            ("macos", arch) => unsupported(format!(
                "MLX runs on Apple Silicon Macs only (aarch64), not {arch}"
            )),
            ("linux", arch @ ("x86_64" | "aarch64")) => Ok(Wheel {
                package: if self.cuda { "mlx-cuda-13" } else { "mlx-cpu" },
                backend: if self.cuda {
                    Backend::Cuda
                } else {
                    Backend::Cpu
                },
                platform: Platform::Manylinux {
                    arch: if arch == "x86_64" {
                        "x86_64"
                    } else {
                        "aarch64"
                    },
                },
            }),
            ("linux", arch) => unsupported(format!(
                "PyPI ships MLX for Linux on x86_64 and aarch64, not {arch}; set MLX_DIR to an \
                 MLX {MLX_VERSION} you built"
            )),
            (os, _) => unsupported(format!(
                "MLX runs on macOS (Metal) and Linux (CPU, CUDA), not {os}"
            )),
        }
    }
}

impl Wheel {
    /// The file of [`MLX_VERSION`] for this platform among a package's files.
    pub fn pick<'f>(&self, files: &'f [WheelFile]) -> Option<&'f WheelFile> {
        let prefix = format!("{}-{MLX_VERSION}-", self.package.replace('-', "_"));
        let ours = files.iter().filter(|f| f.filename.starts_with(&prefix));
        match self.platform {
            Platform::Manylinux { arch } => {
                let suffix = format!("-manylinux_2_35_{arch}.whl");
                ours.into_iter().find(|f| f.filename.ends_with(&suffix))
            }
            Platform::MacosArm64 { not_newer_than } => {
                let tagged = ours.filter_map(|f| Some((macos_tag(&f.filename)?, f)));
                match not_newer_than {
                    Some(max) => tagged.filter(|(v, _)| *v <= max).max_by_key(|(v, _)| *v),
                    None => tagged.min_by_key(|(v, _)| *v),
                }
                .map(|(_, f)| f)
            }
        }
    }

    /// Finds this wheel's file on `index`.
    pub fn find(&self, index: &Index) -> Result<WheelFile> {
        let files = index.files(self.package)?;
        self.pick(&files)
            .cloned()
            .ok_or_else(|| index.not_listed(self.package, &self.describe()))
    }

    /// The library file name under `mlx/lib/`.
    pub fn library(&self) -> &'static str {
        library_name(self.backend)
    }

    /// A name for the cache directory of this wheel unpacked (the same for every file that
    /// [`Wheel::pick`] could choose for this target).
    pub fn cache_name(&self) -> String {
        match self.platform {
            Platform::Manylinux { .. } => format!("{}-{MLX_VERSION}", self.package),
            Platform::MacosArm64 {
                not_newer_than: Some((major, minor)),
            } => format!("{}-{MLX_VERSION}-macos{major}.{minor}", self.package),
            Platform::MacosArm64 {
                not_newer_than: None,
            } => {
                format!("{}-{MLX_VERSION}-macos-oldest", self.package)
            }
        }
    }

    fn describe(&self) -> String {
        match self.platform {
            Platform::Manylinux { arch } => {
                format!("{MLX_VERSION} wheel for manylinux_2_35_{arch}")
            }
            Platform::MacosArm64 {
                not_newer_than: Some((major, minor)),
            } => format!(
                "{MLX_VERSION} wheel for macOS {major}.{minor} or older (MLX {MLX_VERSION} needs \
                 macOS 14 or newer)"
            ),
            Platform::MacosArm64 {
                not_newer_than: None,
            } => {
                format!("{MLX_VERSION} wheel for macOS arm64")
            }
        }
    }
}

/// `libmlx.dylib` with Metal, `libmlx.so` otherwise.
pub fn library_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Metal => "libmlx.dylib",
        Backend::Cpu | Backend::Cuda => "libmlx.so",
    }
}

/// `(major, minor)` from a wheel's `macosx_X_Y_arm64` platform tag.
fn macos_tag(filename: &str) -> Option<(u32, u32)> {
    let tag = filename.strip_suffix("_arm64.whl")?;
    let version = &tag[tag.rfind("macosx_")? + "macosx_".len()..];
    let (major, minor) = version.split_once('_')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `(major, minor)` from a macOS version such as `15.3.1`, `14` or `26.0`.
pub fn parse_macos_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// The distribution root holding `mlx/lib/<library>`: `dir` itself or one of its four parents
/// (so `MLX_DIR` may also name `mlx/share/cmake/MLX`, as CMake users tend to).
pub fn dist_root(dir: &Path, backend: Backend) -> Option<PathBuf> {
    dir.ancestors()
        .take(5)
        .find(|d| d.join("mlx/lib").join(library_name(backend)).is_file())
        .map(Path::to_path_buf)
}

/// Checks that an unpacked distribution holds what the build and the binary need: the library,
/// Metal's kernels beside it (`mlx.metallib`, which MLX loads from the library's directory), the
/// headers and the CMake package.
pub fn verify_layout(dist: &Path, backend: Backend) -> Result<()> {
    let mut needed = vec![
        PathBuf::from("mlx/lib").join(library_name(backend)),
        PathBuf::from("mlx/include/mlx/mlx.h"),
        PathBuf::from("mlx/share/cmake/MLX/MLXConfig.cmake"),
    ];
    if backend == Backend::Metal {
        needed.push(PathBuf::from("mlx/lib/mlx.metallib"));
    }
    let missing: Vec<String> = needed
        .iter()
        .filter(|p| !dist.join(p).is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        match cmake_package_version(dist).as_deref() {
            Some(MLX_VERSION) => Ok(()),
            found => Err(Error::file(
                dist,
                format!(
                    "holds MLX {}, not {MLX_VERSION}, which mlx-c 0.7.0 (mlx-rs 0.33) is built \
                     for: point MLX_DIR at MLX {MLX_VERSION}, or unset it",
                    found.unwrap_or("of an unknown version (no MLXConfigVersion.cmake)")
                ),
            )),
        }
    } else {
        Err(Error::file(
            dist,
            format!(
                "not an MLX {MLX_VERSION} distribution: missing {}",
                missing.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests;

/// The version in `mlx/share/cmake/MLX/MLXConfigVersion.cmake` (`set(PACKAGE_VERSION "0.32.4")`).
fn cmake_package_version(dist: &Path) -> Option<String> {
    let text =
        std::fs::read_to_string(dist.join("mlx/share/cmake/MLX/MLXConfigVersion.cmake")).ok()?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("set(PACKAGE_VERSION "))?;
    Some(line.split('"').nth(1)?.to_owned())
}

/// Where MLX wheels are cached, downloaded and unpacked: `MLX_SYS_CACHE`, else
/// `<user cache>/mlx-sys` (see [`crate::user_cache_dir`]).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MLX_SYS_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    Ok(crate::user_cache_dir()?.join("mlx-sys"))
}

/// The distribution for `wheel`, from the cache or fetched (sha256-checked), unpacked and its
/// layout verified; for CUDA with the NVIDIA libraries libmlx loads beside it ([`crate::cuda`]).
pub fn fetch_dist(
    wheel: &Wheel,
    index: &Index,
    mut progress: impl FnMut(crate::Progress),
) -> Result<PathBuf> {
    let cache = cache_dir()?;
    let dest = cache.join(wheel.cache_name());
    if verify_layout(&dest, wheel.backend).is_err() {
        let file = wheel.find(index)?;
        let path = crate::download(&file, &cache.join("wheels"), &mut progress)?;
        crate::unpack_all(&path, &dest)?;
        verify_layout(&dest, wheel.backend)?;
    }
    if let (Backend::Cuda, Platform::Manylinux { arch }) = (wheel.backend, &wheel.platform) {
        crate::cuda::fetch_runtime(&dest, arch, index, progress)?;
    }
    Ok(dest)
}
