//! mlx-c's source, taken from the published `mlx-sys` crate (which vendors it under `src/mlx-c`).
//!
//! `cargo vendor` on a throwaway manifest unpacks it from cargo's registry cache (or fetches it
//! from the registry on a new machine), so no C source is committed here.

use std::{env, fs, path::Path, path::PathBuf, process::Command};

const PUBLISHED: &str = "mlx-sys";
const VERSION: &str = "0.7.0";

/// Returns the mlx-c source root (the directory holding its `CMakeLists.txt`).
pub fn unpack(out_dir: &Path) -> PathBuf {
    let work = out_dir.join("mlx-c-source");
    let root = work.join(format!("vendor/{PUBLISHED}-{VERSION}/src/mlx-c"));
    if root.join("CMakeLists.txt").is_file() {
        return root;
    }
    fs::create_dir_all(&work).expect("create the mlx-c source directory in OUT_DIR");
    // `[workspace]` keeps cargo from taking this manifest for a member of the enclosing workspace.
    let manifest = format!(
        "[package]\nname = \"mlx-c-source\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         [lib]\npath = \"lib.rs\"\n[dependencies]\n{PUBLISHED} = \"={VERSION}\"\n[workspace]\n"
    );
    fs::write(work.join("Cargo.toml"), manifest).expect("write the throwaway manifest");
    fs::write(work.join("lib.rs"), "").expect("write the throwaway lib.rs");

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["vendor", "--quiet", "--versioned-dirs", "vendor"])
        .current_dir(&work)
        .env_remove("CARGO_TARGET_DIR")
        .stdout(std::process::Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() && root.join("CMakeLists.txt").is_file() => root,
        Ok(s) => crate::fail(&format!(
            "mlx-sys: `cargo vendor` of {PUBLISHED} {VERSION} failed ({s}) in {}. mlx-c's source \
             comes from crates.io: check that the registry is reachable (or its cache holds \
             {PUBLISHED}-{VERSION}.crate)",
            work.display()
        )),
        Err(e) => crate::fail(&format!("mlx-sys: could not run cargo vendor: {e}")),
    }
}
