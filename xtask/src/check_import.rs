//! `cargo xtask check-import`: the imported models, judged by the reference stack.
//!
//! Loads the directories from `cargo xtask setup` with transformers and mlx-lm from the
//! reference venv:
//! - SmolLM2 (`py/check_import.py`): the chat template and its ids, then a greedy answer to
//!   "What is the capital of France?" that must name Paris;
//! - Gemma 3 270M (`py/check_import_gemma3.py`): token ids against transformers' own GGUF
//!   tokenizer on the same file, decode round trips, then mlx-lm's likelihood of a known
//!   paragraph and greedy continuations that must name Paris.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::{setup, venv};

/// Runs the checks; fails if any part of them does.
pub fn run() -> anyhow::Result<()> {
    let model_dir = setup::default_model_dir()?;
    let gguf_path = setup::smollm2_gguf()?;
    // The template straight from the GGUF, not from our tokenizer_config.json.
    let gguf = gguf::GgufFile::open(&gguf_path)?;
    let template: String = gguf.require("tokenizer.chat_template")?;
    let template_file = std::env::temp_dir().join(format!(
        "mlx-worker-chat-template-{}.jinja",
        std::process::id()
    ));
    std::fs::write(&template_file, template)
        .with_context(|| format!("writing {}", template_file.display()))?;
    let smollm2 = run_script("check_import.py", &model_dir, &template_file);
    let _ = std::fs::remove_file(&template_file);
    smollm2?;

    let gemma3_dir = setup::gemma3_270m_dir()?;
    let gemma3_gguf = setup::gemma3_gguf()?;
    run_script("check_import_gemma3.py", &gemma3_dir, &gemma3_gguf)
}

/// Runs `xtask/py/<script> MODEL_DIR ARG` with the reference Python, offline.
fn run_script(script: &str, model_dir: &Path, arg: &Path) -> anyhow::Result<()> {
    let python = venv::reference_python()?;
    let script = crate::workspace_root().join("xtask/py").join(script);
    let status = Command::new(&python)
        .arg(&script)
        .arg(model_dir)
        .arg(arg)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .status()
        .with_context(|| format!("starting {}", python.display()))?;
    if !status.success() {
        bail!(
            "the imported model at {} failed the reference check {} (see above)",
            model_dir.display(),
            script.display()
        );
    }
    Ok(())
}
