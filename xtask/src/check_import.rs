//! `cargo xtask check-import`: the imported default model, judged by the reference stack.
//!
//! Loads the directory from `cargo xtask setup` with transformers and mlx-lm from the
//! reference venv (`py/check_import.py`): the chat template and its ids, then a greedy answer
//! to "What is the capital of France?" that must name Paris.

use std::process::Command;

use anyhow::{bail, Context};

use crate::{setup, venv};

/// Runs the check; fails if any part of it does.
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

    let python = venv::reference_python()?;
    let script = crate::workspace_root().join("xtask/py/check_import.py");
    let status = Command::new(&python)
        .arg(&script)
        .arg(&model_dir)
        .arg(&template_file)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .status()
        .with_context(|| format!("starting {}", python.display()));
    let _ = std::fs::remove_file(&template_file);
    if !status?.success() {
        bail!(
            "the imported model at {} failed the reference check (see above)",
            model_dir.display()
        );
    }
    Ok(())
}
