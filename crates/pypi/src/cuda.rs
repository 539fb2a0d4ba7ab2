//! The NVIDIA libraries that MLX's CUDA build loads, from their PyPI wheels.
//!
//! `mlx-cuda-13`'s libmlx needs cuBLAS, cuFFT, NVRTC, cuDNN and NCCL (and the driver's
//! `libcuda.so.1`, which every machine with an NVIDIA driver has). Its RPATH looks for them where
//! pip puts them, beside `mlx/`: `$ORIGIN/../../nvidia/{cu13,cublas,cuda_nvrtc,cudnn,cufft,nccl}/lib`.
//! So the build unpacks the same wheels pip would install into the MLX distribution's root, and a
//! binary that finds libmlx (through its own rpath) finds them too, from any directory.
//!
//! The wheels are pinned (reproducible builds; the index gives each file's sha256) and the pins
//! are checked against the wheel's own `Requires-Dist`, so an MLX that needs something else
//! stops the build instead of failing at run time.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Index, Result};

/// The newest release of every `Requires-Dist` of `mlx-cuda-13` 0.32.4 on 2026-12-05 (what
/// `pip install mlx-cuda-13==0.32.4` installs), and of what cuSOLVER's wheel requires in turn
/// (`libcusolver.so.12` needs cuSPARSE and nvJitLink beside it in `nvidia/cu13/lib`).
pub const RUNTIME: [(&str, &str); 9] = [
    ("nvidia-cublas", "13.8.2.12"),
    ("nvidia-cuda-nvrtc", "13.5.37"),
    ("nvidia-cuda-runtime", "13.5.37"),
    ("nvidia-cudnn-cu13", "9.28.1.4"),
    ("nvidia-cufft", "12.5.0.14"),
    ("nvidia-cusolver", "12.4.1.2"),
    ("nvidia-cusparse", "12.9.4.2"),
    ("nvidia-nvjitlink", "13.5.37"),
    ("nvidia-nccl-cu13", "2.32.6"),
];

/// libmlx's NEEDED libraries that the wheels provide.
pub const LIBRARIES: [&str; 6] = [
    "libcublasLt.so.13",
    "libcufft.so.12",
    "libcusolver.so.12",
    "libnvrtc.so.13",
    "libcudnn.so.9",
    "libnccl.so.2",
];

/// Written last into `<dist>/nvidia/`: the pins that were unpacked there.
const DONE: &str = ".mlx-sys-pins";

/// Makes `<dist>/nvidia/` hold [`RUNTIME`]'s wheels for `arch`, fetching them the first time.
pub fn fetch_runtime(
    dist: &Path,
    arch: &str,
    index: &Index,
    mut progress: impl FnMut(crate::Progress),
) -> Result<()> {
    let nvidia = dist.join("nvidia");
    if fs::read_to_string(nvidia.join(DONE)).ok().as_deref() == Some(&pins()) {
        return missing_libraries(dist);
    }
    check_requirements(&mlx_metadata(dist)?)?;
    let _ = fs::remove_dir_all(&nvidia);
    let wheels = crate::mlx::cache_dir()?.join("wheels");
    for (package, version) in RUNTIME {
        let files = index.files(package)?;
        let file = pick(&files, package, version, arch)
            .ok_or_else(|| index.not_listed(package, &format!("{version} wheel for {arch}")))?;
        let wheel = crate::download(file, &wheels, &mut progress)?;
        let unpacked = dist.join(format!("{package}.unpacking"));
        crate::unpack_all(&wheel, &unpacked)?;
        merge(&unpacked.join("nvidia"), &nvidia)?;
        let _ = fs::remove_dir_all(&unpacked);
        // Unpacked, the wheel (up to half a gigabyte) is not needed again.
        let _ = fs::remove_file(&wheel);
    }
    missing_libraries(dist)?;
    fs::write(nvidia.join(DONE), pins()).map_err(|e| Error::file(&nvidia, e))
}

fn pins() -> String {
    RUNTIME.iter().map(|(p, v)| format!("{p}=={v}\n")).collect()
}

/// `package`'s wheel of `version` for Linux on `arch` (`manylinux..._<arch>`, any Python 3).
fn pick<'f>(
    files: &'f [crate::WheelFile],
    package: &str,
    version: &str,
    arch: &str,
) -> Option<&'f crate::WheelFile> {
    let prefix = format!("{}-{version}-py3-none-", package.replace('-', "_"));
    let suffix = format!("_{arch}.whl");
    files
        .iter()
        .find(|f| f.filename.starts_with(&prefix) && f.filename.ends_with(&suffix))
}

/// Moves every file under `from` to the same place under `to` (several wheels share
/// `nvidia/cu13/`).
fn merge(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| Error::file(to, e))?;
    for entry in fs::read_dir(from).map_err(|e| Error::file(from, e))? {
        let entry = entry.map_err(|e| Error::file(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry
            .file_type()
            .map_err(|e| Error::file(&src, e))?
            .is_dir()
        {
            merge(&src, &dst)?;
        } else {
            fs::rename(&src, &dst).map_err(|e| Error::file(&dst, e))?;
        }
    }
    Ok(())
}

/// An error naming the [`LIBRARIES`] that no `<dist>/nvidia/*/lib/` holds.
pub fn missing_libraries(dist: &Path) -> Result<()> {
    let dirs: Vec<PathBuf> = fs::read_dir(dist.join("nvidia"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("lib"))
        .collect();
    let missing: Vec<&str> = LIBRARIES
        .into_iter()
        .filter(|lib| !dirs.iter().any(|d| d.join(lib).is_file()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::file(
        &dist.join("nvidia"),
        format!(
            "lacks {} that MLX's CUDA build loads: delete {} to fetch the NVIDIA wheels again",
            missing.join(", "),
            dist.join("nvidia").display()
        ),
    ))
}

/// The unpacked `mlx-cuda-13` wheel's `METADATA`.
fn mlx_metadata(dist: &Path) -> Result<String> {
    let info = format!("mlx_cuda_13-{}.dist-info/METADATA", crate::mlx::MLX_VERSION);
    fs::read_to_string(dist.join(&info)).map_err(|e| Error::file(&dist.join(info), e))
}

/// Every unconditional `Requires-Dist` of `metadata` must be pinned in [`RUNTIME`] by a version
/// its specifier allows (`==X.*`, `==X` or none: what `mlx-cuda-13` uses).
pub fn check_requirements(metadata: &str) -> Result<()> {
    for line in metadata.lines() {
        let Some(requirement) = line.strip_prefix("Requires-Dist:") else {
            continue;
        };
        if requirement.contains(';') {
            continue; // an extra or a marker: not what `pip install mlx-cuda-13` pulls in
        }
        let requirement = requirement.trim();
        let end = requirement
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or(requirement.len());
        let (name, spec) = (&requirement[..end], requirement[end..].trim());
        let unpinned = || {
            Error::Unsupported(format!(
                "MLX's CUDA wheel requires `{requirement}`, which pypi::cuda::RUNTIME does not \
                 pin: add the release pip installs for it"
            ))
        };
        let name = name.to_ascii_lowercase().replace(['_', '.'], "-");
        let (_, version) = RUNTIME
            .iter()
            .find(|(p, _)| *p == name)
            .ok_or_else(unpinned)?;
        let allowed = match spec.strip_prefix("==") {
            None if spec.is_empty() => true,
            None => false,
            Some(v) => match v.trim().strip_suffix(".*") {
                Some(prefix) => version.starts_with(&format!("{prefix}.")),
                None => *version == v.trim(),
            },
        };
        if !allowed {
            return Err(unpinned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLX_CUDA_13: &str = "Metadata-Version: 2.4\nName: mlx-cuda-13\nVersion: 0.32.4\n\
        Requires-Python: >=3.10\nRequires-Dist: nvidia-cudnn-cu13==9.*\n\
        Requires-Dist: nvidia-nccl-cu13\nRequires-Dist: nvidia-cublas==13.*\n\
        Requires-Dist: nvidia-cufft==12.*\nRequires-Dist: nvidia-cuda-nvrtc==13.*\n\
        Requires-Dist: nvidia-cuda-runtime==13.*\nRequires-Dist: nvidia-cusolver==12.*\n\
        Dynamic: requires-dist\n";

    #[test]
    fn the_pins_satisfy_what_mlx_cuda_13_requires() {
        check_requirements(MLX_CUDA_13).unwrap();
    }

    #[test]
    fn a_requirement_without_a_pin_or_outside_it_stops_the_build() {
        let more = format!("{MLX_CUDA_13}Requires-Dist: nvidia-cusparse==13.*\n");
        let e = check_requirements(&more).unwrap_err().to_string();
        assert!(e.contains("nvidia-cusparse==13.*"), "{e}");
        let newer = MLX_CUDA_13.replace("cudnn-cu13==9.*", "cudnn-cu13==10.*");
        assert!(check_requirements(&newer).is_err());
        let extra = format!("{MLX_CUDA_13}Requires-Dist: pytest; extra == \"dev\"\n");
        check_requirements(&extra).unwrap();
    }

    #[test]
    fn the_wheel_for_the_arch_is_picked_whatever_its_manylinux_tag() {
        let file = |name: &str| crate::WheelFile {
            filename: name.into(),
            url: String::new(),
            sha256: String::new(),
            size: None,
        };
        let files = [
            file(
                "nvidia_cufft-12.5.0.14-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
            ),
            file("nvidia_cufft-12.5.0.14-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"),
            file("nvidia_cufft-12.4.0.43-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"),
        ];
        let got = pick(&files, "nvidia-cufft", "12.5.0.14", "x86_64").unwrap();
        assert_eq!(got.filename, files[1].filename);
        assert!(pick(&files, "nvidia-cufft", "12.5.0.14", "ppc64le").is_none());
    }
}
