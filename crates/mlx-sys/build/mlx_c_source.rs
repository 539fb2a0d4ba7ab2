//! mlx-c's source, taken from the published `mlx-sys` crate (which vendors it under `src/mlx-c`).
//!
//! `cargo vendor` on a throwaway manifest unpacks it from cargo's registry cache (or fetches it
//! from the registry on a new machine), so no C source is committed here.

use std::{env, fs, path::Path, path::PathBuf, process::Command};

const PUBLISHED: &str = "mlx-sys";
const VERSION: &str = "0.7.0";

/// Returns the mlx-c source root (the directory holding its `CMakeLists.txt`), made to build
/// against the MLX this crate links ([`fit_to_mlx`]).
pub fn unpack(out_dir: &Path) -> PathBuf {
    let root = vendor(out_dir);
    fit_to_mlx(&root);
    root
}

/// MLX 0.32.4 gave `gather_qmm` a `global_scale` argument (for nvfp4) before `sorted_indices`;
/// mlx-c 0.7.0, written for 0.32.2, passes its arguments by position, so its `sorted_indices`
/// would land on `global_scale` (a compile error). The call gets `std::nullopt` there: what
/// 0.32.2 computed. Idempotent; fails loudly when the call is not found exactly once.
fn fit_to_mlx(root: &Path) {
    const CALL: &str = "            std::string(mode),\n            sorted_indices,\n";
    const FITTED: &str = "            std::string(mode),\n            std::nullopt /* global_scale, MLX 0.32.4 */,\n            sorted_indices,\n";
    let ops = root.join("mlx/c/ops.cpp");
    let text = fs::read_to_string(&ops).expect("read mlx-c's ops.cpp");
    if text.contains(FITTED) {
        return;
    }
    if text.matches(CALL).count() != 1 {
        crate::fail(&format!(
            "mlx-sys: {} does not call gather_qmm as mlx-c {VERSION} does: update \
             build/mlx_c_source.rs for this mlx-c",
            ops.display()
        ));
    }
    fs::write(&ops, text.replace(CALL, FITTED)).expect("write mlx-c's ops.cpp");
}

fn vendor(out_dir: &Path) -> PathBuf {
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
