//! The prebuilt MLX for Linux: PyPI's `mlx-cpu` / `mlx-cuda-13` wheels, version-matched to mlx-c.
//!
//! A wheel is a zip; unpacked, it holds `mlx/lib/libmlx.so`, `mlx/include`, `mlx/share/cmake/MLX`
//! and the libraries libmlx's rpath points at (`<name>.libs/`). `MLX_DIR` may point at any
//! directory with that layout (an unpacked wheel, or a Python `site-packages`).

use std::{
    env, fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

/// The MLX release mlx-c 0.7.0 pins; headers of any other release break its build.
pub const MLX_VERSION: &str = "0.32.2";

/// Which wheel to link.
pub fn package_name() -> &'static str {
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        "mlx-cuda-13"
    } else {
        "mlx-cpu"
    }
}

/// Returns a directory holding `mlx/lib/libmlx.so`: `MLX_DIR`, or the wheel unpacked into the cache.
pub fn mlx_dist() -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLX_WHEEL_INDEX");
    if let Some(dir) = env::var_os("MLX_DIR") {
        return dist_root(Path::new(&dir)).unwrap_or_else(|| {
            crate::fail(&format!(
                "mlx-sys: MLX_DIR={} holds no mlx/lib/libmlx.so. Point it at an unpacked MLX \
                 {MLX_VERSION} wheel or a site-packages with `pip install mlx-cpu=={MLX_VERSION}`, \
                 or unset it to let the build fetch the wheel",
                Path::new(&dir).display()
            ))
        });
    }
    let package = package_name();
    let dest = cache_dir().join(format!("{package}-{MLX_VERSION}"));
    if dest.join("mlx/lib/libmlx.so").is_file() {
        return dest;
    }
    let wheel = download(package, &cache_dir().join("wheels"));
    unpack(&wheel, &dest);
    dest
}

/// Accepts the distribution root itself or its `mlx/share/cmake/MLX` directory (CMake's habit).
fn dist_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .take(5)
        .find(|d| d.join("mlx/lib/libmlx.so").is_file())
        .map(Path::to_path_buf)
}

fn cache_dir() -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_SYS_CACHE");
    if let Some(dir) = env::var_os("MLX_SYS_CACHE") {
        return PathBuf::from(dir);
    }
    let base = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| crate::fail("mlx-sys: set HOME, XDG_CACHE_HOME or MLX_SYS_CACHE"));
    base.join("mlx-sys")
}

fn wheel_platform_tag() -> &'static str {
    match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64",
        Ok("aarch64") => "aarch64",
        _ => {
            crate::fail("mlx-sys: PyPI ships MLX for Linux on x86_64 and aarch64 only; set MLX_DIR")
        }
    }
}

/// Downloads this platform's wheel listed by PyPI's simple index (PEP 691 JSON) and checks its
/// sha256.
fn download(package: &str, dir: &Path) -> PathBuf {
    let index = env::var("MLX_WHEEL_INDEX").unwrap_or_else(|_| "https://pypi.org/simple".into());
    let url = format!("{index}/{package}/");
    let body = agent()
        .get(&url)
        .header("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .and_then(|mut r| r.body_mut().with_config().limit(64 << 20).read_to_string())
        .unwrap_or_else(|e| fetch_failed(&url, &e.to_string()));
    let listing: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| fetch_failed(&url, &e.to_string()));
    let arch = wheel_platform_tag();
    let prefix = format!("{}-{MLX_VERSION}-", package.replace('-', "_"));
    let file = listing["files"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| {
            let name = f["filename"].as_str().unwrap_or("");
            name.starts_with(&prefix) && name.ends_with(&format!("manylinux_2_35_{arch}.whl"))
        })
        .unwrap_or_else(|| {
            fetch_failed(
                &url,
                &format!("no {prefix}*manylinux_2_35_{arch}.whl listed"),
            )
        });
    let (name, file_url, sha) = (
        file["filename"].as_str().unwrap_or_default(),
        file["url"].as_str().unwrap_or_default(),
        file["hashes"]["sha256"].as_str().unwrap_or_default(),
    );
    let path = dir.join(name);
    if path.is_file() && sha256_of(&path) == sha {
        return path;
    }
    fs::create_dir_all(dir).expect("create the wheel cache directory");
    let partial = path.with_extension("part");
    let mut reader = agent()
        .get(file_url)
        .call()
        .unwrap_or_else(|e| fetch_failed(file_url, &e.to_string()))
        .into_body()
        .into_reader();
    let mut out = fs::File::create(&partial).expect("create the wheel file");
    io::copy(&mut reader, &mut out).unwrap_or_else(|e| fetch_failed(file_url, &e.to_string()));
    if sha256_of(&partial) != sha {
        crate::fail(&format!(
            "mlx-sys: {name} from {file_url} does not match its sha256 {sha}"
        ));
    }
    fs::rename(&partial, &path).expect("move the wheel into the cache");
    path
}

/// An HTTP client trusting the system's certificate store (registries may sit behind a proxy CA).
fn agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder().tls_config(tls).build().into()
}

fn fetch_failed(url: &str, why: &str) -> ! {
    crate::fail(&format!(
        "mlx-sys: fetching {url} failed: {why}.\nWithout network, install MLX and point MLX_DIR at \
         it: `pip install --target DIR {}=={MLX_VERSION}` then `MLX_DIR=DIR cargo build`",
        package_name()
    ))
}

fn sha256_of(path: &Path) -> String {
    let mut hasher = Sha256::new();
    let mut file = fs::File::open(path).expect("open the wheel");
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).expect("read the wheel");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Unpacks into a temporary sibling, then renames, so a half-unpacked wheel is never used.
fn unpack(wheel: &Path, dest: &Path) {
    let tmp = dest.with_extension("unpacking");
    let _ = fs::remove_dir_all(&tmp);
    let file = fs::File::open(wheel).expect("open the wheel");
    let mut archive = zip::ZipArchive::new(file).unwrap_or_else(|e| {
        crate::fail(&format!("mlx-sys: {} is not a wheel: {e}", wheel.display()))
    });
    archive
        .extract(&tmp)
        .unwrap_or_else(|e| crate::fail(&format!("mlx-sys: unpacking {}: {e}", wheel.display())));
    let _ = fs::remove_dir_all(dest);
    fs::rename(&tmp, dest).expect("move the unpacked wheel into place");
}
