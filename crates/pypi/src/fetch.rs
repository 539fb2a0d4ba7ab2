//! Downloads checked against the sha256 the index publishes.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Error, Result, WheelFile};

/// How far a download has come: bytes so far, and the total when the index gave it.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub done: u64,
    pub total: Option<u64>,
}

/// Downloads `file` into `dir` (kept there as a cache) and returns its path. A cached copy is
/// reused when its sha256 matches; a new one is written under a temporary name, checked, then
/// renamed, so a partial or corrupt download never has the final name. `progress` is called
/// about every megabyte.
pub fn download(
    file: &WheelFile,
    dir: &Path,
    mut progress: impl FnMut(Progress),
) -> Result<PathBuf> {
    let path = dir.join(&file.filename);
    if path.is_file() && sha256_of(&path)? == file.sha256 {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    let partial = path.with_extension(format!("part-{}", std::process::id()));
    let fetch_failed = |why: String| Error::Fetch {
        url: file.url.clone(),
        why,
    };
    let mut reader = agent()
        .get(&file.url)
        .call()
        .map_err(|e| fetch_failed(e.to_string()))?
        .into_body()
        .into_reader();
    let mut out = fs::File::create(&partial).map_err(|e| Error::file(&partial, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = fs::remove_file(&partial);
                return Err(fetch_failed(e.to_string()));
            }
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| Error::file(&partial, e))?;
        done += n as u64;
        progress(Progress {
            done,
            total: file.size,
        });
    }
    drop(out);
    let got = hex(&hasher.finalize());
    if got != file.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(Error::Checksum {
            file: format!("{} from {}", file.filename, file.url),
            got,
            expected: file.sha256.clone(),
        });
    }
    fs::rename(&partial, &path).map_err(|e| Error::file(&path, e))?;
    Ok(path)
}

/// An HTTP client trusting the system's certificate store (registries may sit behind a proxy
/// CA that only the system store holds; ureq's bundled roots reject it).
pub(crate) fn agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder().tls_config(tls).build().into()
}

/// Hex sha256 of a file.
pub fn sha256_of(path: &Path) -> Result<String> {
    let mut file = fs::File::open(path).map_err(|e| Error::file(path, e))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(|e| Error::file(path, e))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_known_text() {
        let dir = std::env::temp_dir().join(format!("pypi-sha-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("abc");
        fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_of(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
