//! Parity with real Pillow, transformers and mlx-vlm: `tests/reference.py` (run with the
//! workspace venv's python, `<workspace>/.venv`) writes test images and what Python computes
//! from them; this test recomputes everything in Rust and compares:
//! - decoding: byte-identical to `exif_transpose(Image.open(f)).convert("RGB")` for PNG, GIF and
//!   WebP (with PIL's colour key), and for JPEG with the feature `turbojpeg`; otherwise JPEG's
//!   largest difference is reported (zune-jpeg is not libjpeg-turbo);
//! - resize: byte-identical to `Image.resize` for all six filters, several sizes each;
//! - processors: shapes and extras equal, pixel values within `MAX_PIXEL_DIFF` (0 measured),
//!   from PIL's decoded pixels and end to end from the files (except JPEG, reported).
//!
//! Without the venv the test is skipped, unless `MLX_WORKER_REQUIRE_MODELS=1` (as `cargo xtask
//! test` runs), which makes a missing venv a failure. `IMAGES_PARITY_KEEP=1` keeps the files.

use std::path::{Path, PathBuf};
use std::process::Command;

use images::processors::Processor;
use images::{decode, resize, DecodeLimits, Filter, RgbImage};
use serde_json::Value;

/// Largest allowed difference in processor outputs (float32; the arithmetic is the same, so 0 is
/// expected and measured; a bound, not 0, so that a platform's libm cannot fail the test alone).
const MAX_PIXEL_DIFF: f32 = 1e-6;

fn venv_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    let ready = python.is_file()
        && Command::new(&python)
            .args(["-c", "import PIL, numpy, transformers, mlx_vlm"])
            .output()
            .is_ok_and(|o| o.status.success());
    if ready {
        return Some(python);
    }
    assert!(
        std::env::var_os("MLX_WORKER_REQUIRE_MODELS").is_none_or(|v| v != "1"),
        "{} is missing or lacks Pillow, NumPy, transformers or mlx-vlm, and \
         MLX_WORKER_REQUIRE_MODELS=1: set up the venv (`cargo xtask setup`)",
        python.display()
    );
    eprintln!(
        "skipped: no venv with Pillow, transformers and mlx-vlm at {}",
        python.display()
    );
    None
}

struct Reference {
    dir: PathBuf,
    manifest: Value,
}

impl Reference {
    fn generate(python: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("images-parity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference.py");
        let out = Command::new(python)
            .arg(&script)
            .arg(&dir)
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("running the venv's python");
        assert!(
            out.status.success(),
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
        let manifest =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap();
        Self { dir, manifest }
    }

    fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// PIL's decoded image (with its colour key), the input of the resize and processor checks.
    fn pil_image(&self, name: &str) -> RgbImage {
        let meta = self.manifest["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap();
        let mut img = RgbImage::new(
            meta["width"].as_u64().unwrap() as u32,
            meta["height"].as_u64().unwrap() as u32,
            self.read(&format!("decoded/{name}.rgb")),
        );
        img.transparency = meta["transparency"].as_array().map(|k| {
            let c = |i: usize| k[i].as_u64().unwrap() as u8;
            [c(0), c(1), c(2)]
        });
        img
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        if std::env::var_os("IMAGES_PARITY_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {}", self.dir.display());
        }
    }
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// Whether our decoder must give PIL's bytes: all but JPEG, and JPEG too with libjpeg-turbo
/// (feature `turbojpeg`).
fn exact_decode(meta: &Value) -> bool {
    meta["exact_decode"].as_bool().unwrap() || cfg!(feature = "turbojpeg")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn matches_pillow_transformers_and_mlx_vlm() {
    let Some(python) = venv_python() else { return };
    let reference = Reference::generate(&python);
    let mut failures = Vec::new();

    // Decoding.
    for meta in reference.manifest["images"].as_array().unwrap() {
        let name = meta["name"].as_str().unwrap();
        let bytes = reference.read(&format!("inputs/{name}"));
        let ours = match decode(&bytes, &DecodeLimits::default()) {
            Ok(img) => img,
            Err(e) => {
                failures.push(format!("decode {name}: {e}"));
                continue;
            }
        };
        let pil = reference.pil_image(name);
        if (ours.width, ours.height) != (pil.width, pil.height) {
            failures.push(format!(
                "decode {name}: {}x{}, PIL {}x{}",
                ours.width, ours.height, pil.width, pil.height
            ));
            continue;
        }
        let diffs = ours
            .pixels
            .iter()
            .zip(&pil.pixels)
            .filter(|(a, b)| a != b)
            .count();
        let max = ours
            .pixels
            .iter()
            .zip(&pil.pixels)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap_or(0);
        if exact_decode(meta) {
            if diffs != 0 || ours.transparency != pil.transparency {
                failures.push(format!(
                    "decode {name}: {diffs} bytes differ (max {max}); key {:?}, PIL {:?}",
                    ours.transparency, pil.transparency
                ));
            }
        } else {
            eprintln!(
                "decode {name} (lossy codec, other decoder): {diffs} of {} bytes differ, max {max}",
                ours.pixels.len()
            );
        }
    }

    // Resize: every filter, every size, byte for byte.
    let resizes = reference.manifest["resize"].as_array().unwrap();
    let mut resize_failures = 0;
    for case in resizes {
        let name = case["image"].as_str().unwrap();
        let filter = Filter::from_pil(case["filter"].as_i64().unwrap()).unwrap();
        let (w, h) = (
            case["width"].as_u64().unwrap() as u32,
            case["height"].as_u64().unwrap() as u32,
        );
        let ours = resize(&reference.pil_image(name), w, h, filter);
        let pil = reference.read(&format!("resize/{}", case["out"].as_str().unwrap()));
        if ours.pixels != pil {
            resize_failures += 1;
            let (diffs, max) = ours
                .pixels
                .iter()
                .zip(&pil)
                .fold((0, 0), |(n, m), (&a, &b)| {
                    (n + usize::from(a != b), m.max(a.abs_diff(b)))
                });
            failures.push(format!(
                "resize {name} {filter:?} to {w}x{h}: {diffs} bytes differ, max {max}"
            ));
        }
    }
    eprintln!(
        "resize: {} of {} cases byte-identical with Pillow",
        resizes.len() - resize_failures,
        resizes.len()
    );

    // Processors.
    let models = &reference.manifest["models"];
    let mut worst = 0f32;
    let mut worst_jpeg = 0f32;
    let runs = reference.manifest["processors"].as_array().unwrap();
    for run in runs {
        let model = run["model"].as_str().unwrap();
        let label = format!("{model} on {}", run["images"]);
        let dir = PathBuf::from(models[model]["dir"].as_str().unwrap());
        let processor = Processor::from_model_dir(&dir, run["model_type"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let images: Vec<RgbImage> = run["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| reference.pil_image(n.as_str().unwrap()))
            .collect();
        let ours = match processor.preprocess(&images) {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{label}: {e}"));
                continue;
            }
        };
        let shape = usizes(&run["shape"]);
        if ours.pixel_values.shape != shape {
            failures.push(format!(
                "{label}: shape {:?}, Python {shape:?}",
                ours.pixel_values.shape
            ));
            continue;
        }
        let theirs: Vec<f32> = reference
            .read(run["pixel_values"].as_str().unwrap())
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let max = max_diff(&ours.pixel_values.data, &theirs);
        worst = worst.max(max);
        if max > MAX_PIXEL_DIFF {
            failures.push(format!("{label}: pixel values differ by up to {max}"));
        }
        // End to end from the files, with our decoder: identical where decoding is; for JPEG
        // (another decoder than Pillow's libjpeg-turbo) the difference is reported.
        let from_files: Vec<RgbImage> = run["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let bytes = reference.read(&format!("inputs/{}", n.as_str().unwrap()));
                decode(&bytes, &DecodeLimits::default()).unwrap()
            })
            .collect();
        let end_to_end = processor.preprocess(&from_files).unwrap();
        let e2e_max = max_diff(&end_to_end.pixel_values.data, &theirs);
        let lossy = run["images"].as_array().unwrap().iter().any(|n| {
            reference.manifest["images"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["name"] == *n && !exact_decode(i))
        });
        if lossy {
            worst_jpeg = worst_jpeg.max(e2e_max);
            eprintln!("end to end {label} (JPEG, other decoder): largest difference {e2e_max}");
        } else if e2e_max > MAX_PIXEL_DIFF {
            failures.push(format!(
                "{label}: end to end from the file, differs by up to {e2e_max}"
            ));
        }
        if let Some(sizes) = run.get("image_sizes") {
            let sizes: Vec<[usize; 2]> = sizes
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let s = usizes(s);
                    [s[0], s[1]]
                })
                .collect();
            if ours.image_sizes != sizes {
                failures.push(format!(
                    "{label}: image sizes {:?}, Python {sizes:?}",
                    ours.image_sizes
                ));
            }
        }
        if let Some(grid) = run.get("image_grid_thw") {
            let grid: Vec<[usize; 3]> = grid
                .as_array()
                .unwrap()
                .iter()
                .map(|g| {
                    let g = usizes(g);
                    [g[0], g[1], g[2]]
                })
                .collect();
            if ours.image_grid_thw != grid {
                failures.push(format!(
                    "{label}: image_grid_thw {:?}, Python {grid:?}",
                    ours.image_grid_thw
                ));
            }
        }
        if let Some(crops) = run.get("num_crops") {
            if ours.num_crops != usizes(crops) {
                failures.push(format!("{label}: num_crops {:?}", ours.num_crops));
            }
        }
        if let Some(rows) = run.get("rows") {
            if ours.rows != usizes(rows) || ours.cols != usizes(&run["cols"]) {
                failures.push(format!(
                    "{label}: rows/cols {:?}/{:?}, Python {rows}/{}",
                    ours.rows, ours.cols, run["cols"]
                ));
            }
        }
        if let Some(mask) = run.get("mask") {
            let theirs = reference.read(mask.as_str().unwrap());
            let ours_mask = ours.pixel_attention_mask.as_ref();
            if ours_mask.map(|m| (&m.data, &m.shape))
                != Some((&theirs, &usizes(&run["mask_shape"])))
            {
                failures.push(format!("{label}: pixel_attention_mask differs"));
            }
        }
    }
    let jpeg = if cfg!(feature = "turbojpeg") {
        "JPEG decoded by libjpeg-turbo, asserted with the rest".to_owned()
    } else {
        format!("end to end from JPEG files (zune-jpeg) {worst_jpeg:e}")
    };
    eprintln!(
        "processors: {} runs, largest pixel-value difference {worst:e} (from PIL's pixels, and \
         end to end from the files); {jpeg}",
        runs.len()
    );

    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
