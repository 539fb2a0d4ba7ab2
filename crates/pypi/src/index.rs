//! A package's files as PyPI's simple index lists them (PEP 691 JSON).
//!
//! The simple index is what pip reads; it answers through registry proxies where the
//! per-version JSON API (`/pypi/NAME/VERSION/json`) may not.

use crate::{Error, Result};

/// One file of a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelFile {
    pub filename: String,
    pub url: String,
    pub sha256: String,
    pub size: Option<u64>,
}

/// A simple index: PyPI's, or another one with the same API.
#[derive(Debug, Clone)]
pub struct Index {
    base: String,
}

impl Index {
    pub const PYPI: &'static str = "https://pypi.org/simple";

    pub fn new(base: impl Into<String>) -> Self {
        Index {
            base: base.into().trim_end_matches('/').to_string(),
        }
    }

    pub fn pypi() -> Self {
        Index::new(Index::PYPI)
    }

    /// Every file of every release of `package` that carries a sha256.
    pub fn files(&self, package: &str) -> Result<Vec<WheelFile>> {
        let url = format!("{}/{package}/", self.base);
        let fetch_failed = |why: String| Error::Fetch {
            url: url.clone(),
            why,
        };
        let body = crate::fetch::agent()
            .get(&url)
            .header("Accept", "application/vnd.pypi.simple.v1+json")
            .call()
            .and_then(|mut r| r.body_mut().with_config().limit(64 << 20).read_to_string())
            .map_err(|e| fetch_failed(e.to_string()))?;
        let listing: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| fetch_failed(format!("not JSON: {e}")))?;
        Ok(parse_files(&listing))
    }

    /// The file named `filename` of `package`.
    pub fn file(&self, package: &str, filename: &str) -> Result<WheelFile> {
        self.files(package)?
            .into_iter()
            .find(|f| f.filename == filename)
            .ok_or_else(|| self.not_listed(package, filename))
    }

    pub(crate) fn not_listed(&self, package: &str, wanted: &str) -> Error {
        Error::NotListed {
            package: package.into(),
            index: self.base.clone(),
            wanted: wanted.into(),
        }
    }
}

fn parse_files(listing: &serde_json::Value) -> Vec<WheelFile> {
    listing["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| {
            Some(WheelFile {
                filename: f["filename"].as_str()?.to_string(),
                url: f["url"].as_str()?.to_string(),
                sha256: f["hashes"]["sha256"].as_str()?.to_string(),
                size: f["size"].as_u64(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_a_sha256_are_left_out() {
        let listing = serde_json::json!({"files": [
            {"filename": "a-1.0-py3-none-any.whl", "url": "https://x/a.whl",
             "hashes": {"sha256": "ab"}, "size": 3},
            {"filename": "b-1.0.tar.gz", "url": "https://x/b", "hashes": {}},
        ]});
        assert_eq!(
            parse_files(&listing),
            [WheelFile {
                filename: "a-1.0-py3-none-any.whl".into(),
                url: "https://x/a.whl".into(),
                sha256: "ab".into(),
                size: Some(3),
            }]
        );
    }
}
