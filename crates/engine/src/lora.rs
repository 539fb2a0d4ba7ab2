//! LoRA adapters: reading one from disk and adding its low-rank updates to a model's linear
//! layers, with a switch that turns them all off for one generation (`use_adapter: false`).
//!
//! Two layouts are read:
//! - mlx-lm's (`mlx_lm.lora` writes it): `adapter_config.json` with `fine_tune_type` and
//!   `lora_parameters.scale`, and `adapters.safetensors` holding `<layer>.lora_a` `(in, r)` and
//!   `<layer>.lora_b` `(r, out)`.
//! - PEFT's (Unsloth and transformers write it): `adapter_config.json` with `peft_type: LORA`,
//!   `r`, `lora_alpha`, `use_rslora`, and `adapter_model.safetensors` holding
//!   `base_model.model.<layer>.lora_A.weight` `(r, in)` and `.lora_B.weight` `(out, r)`.
//!
//! The update is mlx-lm's `LoRALinear`: `y + (scale * ((x @ a) @ b)).astype(x.dtype)`.
//! DoRA, full fine-tunes, LoRA on the embedding and PEFT extras (`modules_to_save`, per-module
//! ranks) are refused by name.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use mlx_rs::Array;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    nn::{Linear, Result},
};

/// Turns every layer of one adapter on or off at once.
#[derive(Debug, Clone)]
pub struct AdapterSwitch(Arc<AtomicBool>);

impl AdapterSwitch {
    fn new() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One layer's low-rank update.
#[derive(Debug)]
pub struct Lora {
    /// `(in, r)`.
    a: Array,
    /// `(r, out)`.
    b: Array,
    scale: f32,
    switch: AdapterSwitch,
}

impl Lora {
    /// `y + scale * (x a) b`, in `x`'s dtype, while the switch is on.
    pub fn add_to(&self, x: &Array, y: Array) -> Result<Array> {
        if !self.switch.is_on() {
            return Ok(y);
        }
        let z = x.matmul(&self.a)?.matmul(&self.b)?;
        // A Python float times an array takes the array's dtype (MLX's weak scalars).
        let scale = Array::from_f32(self.scale).as_dtype(z.dtype())?;
        y.add(scale.multiply(&z)?.as_dtype(x.dtype())?)
    }
}

/// An adapter read from disk, not yet attached.
pub struct Adapter {
    /// `layer name -> (a (in, r), b (r, out))`.
    layers: BTreeMap<String, (Array, Array)>,
    scale: f32,
}

type LoadResult<T> = std::result::Result<T, EngineError>;

fn invalid(dir: &Path, detail: impl std::fmt::Display) -> EngineError {
    EngineError::load(
        LoadErrorKind::InvalidWeights,
        format!("adapter {}: {detail}", dir.display()),
    )
}

fn unsupported(dir: &Path, detail: impl std::fmt::Display) -> EngineError {
    EngineError::load(
        LoadErrorKind::UnsupportedArchitecture,
        format!("adapter {}: {detail}", dir.display()),
    )
}

/// Whether `dir` holds an adapter rather than a model.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join("adapter_config.json").is_file() && !dir.join("config.json").is_file()
}

/// The base model an adapter names (PEFT `base_model_name_or_path`, mlx-lm `model`).
pub fn base_model_of(dir: &Path) -> LoadResult<String> {
    let config = read_config(dir)?;
    ["base_model_name_or_path", "model"]
        .iter()
        .find_map(|k| config.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            invalid(
                dir,
                "adapter_config.json names no base model (`base_model_name_or_path` or \
                 `model`): load the base model with `adapter` set to this directory",
            )
        })
}

fn read_config(dir: &Path) -> LoadResult<Value> {
    let path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        EngineError::load(
            LoadErrorKind::NotFound,
            format!(
                "{}: {e}; an adapter directory has adapter_config.json",
                path.display()
            ),
        )
    })?;
    serde_json::from_str(&text).map_err(|e| invalid(dir, format!("adapter_config.json: {e}")))
}

impl Adapter {
    /// Reads an adapter directory in mlx-lm's or PEFT's layout.
    pub fn load(dir: &Path) -> LoadResult<Self> {
        let config = read_config(dir)?;
        match config.get("peft_type") {
            Some(_) => Self::load_peft(dir, &config),
            None => Self::load_mlx_lm(dir, &config),
        }
    }

    fn load_mlx_lm(dir: &Path, config: &Value) -> LoadResult<Self> {
        let kind = config["fine_tune_type"].as_str().unwrap_or("lora");
        if kind != "lora" {
            return Err(unsupported(
                dir,
                format!("fine_tune_type `{kind}` is not supported; only lora adapters are"),
            ));
        }
        // Required, as mlx-lm requires it (its `alpha` is not this).
        let scale = config["lora_parameters"]["scale"].as_f64().ok_or_else(|| {
            invalid(
                dir,
                "adapter_config.json has no numeric `lora_parameters.scale`",
            )
        })? as f32;
        let tensors = read_tensors(dir, "adapters.safetensors")?;
        let layers = pair_up(dir, tensors, |name, t| match name.rsplit_once('.')? {
            (layer, "lora_a") => Some((layer.to_owned(), Half::A, t)),
            (layer, "lora_b") => Some((layer.to_owned(), Half::B, t)),
            _ => None,
        })?;
        Ok(Self { layers, scale })
    }

    fn load_peft(dir: &Path, config: &Value) -> LoadResult<Self> {
        let peft_type = config["peft_type"].as_str().unwrap_or_default();
        if peft_type != "LORA" {
            return Err(unsupported(
                dir,
                format!("peft_type `{peft_type}` is not supported; only LORA is"),
            ));
        }
        if config["use_dora"].as_bool() == Some(true) {
            return Err(unsupported(dir, "DoRA (`use_dora`) is not supported"));
        }
        for key in ["rank_pattern", "alpha_pattern", "modules_to_save"] {
            let set = match &config[key] {
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Null => false,
                _ => true,
            };
            if set {
                return Err(unsupported(dir, format!("`{key}` is not supported")));
            }
        }
        let r = config["r"].as_f64().filter(|r| *r > 0.0);
        let r = r.ok_or_else(|| invalid(dir, "adapter_config.json: `r` must be positive"))?;
        let alpha = config["lora_alpha"].as_f64().unwrap_or(r);
        let scale = match config["use_rslora"].as_bool() == Some(true) {
            true => alpha / r.sqrt(),
            false => alpha / r,
        } as f32;
        let tensors = read_tensors(dir, "adapter_model.safetensors")?;
        // PEFT stores A `(r, in)` and B `(out, r)`: the transposes of mlx-lm's a and b.
        let layers = pair_up(dir, tensors, |name, t| {
            let inner = name.strip_prefix("base_model.model.").unwrap_or(name);
            match inner.strip_suffix(".lora_A.weight") {
                Some(layer) => Some((layer.to_owned(), Half::A, t.t())),
                None => Some((
                    inner.strip_suffix(".lora_B.weight")?.to_owned(),
                    Half::B,
                    t.t(),
                )),
            }
        })?;
        Ok(Self { layers, scale })
    }

    /// Adds the updates to `linears` (the model's, by checkpoint name); returns the switch.
    pub fn attach(
        self,
        dir: &Path,
        linears: Vec<(String, &mut Linear)>,
    ) -> LoadResult<AdapterSwitch> {
        let switch = AdapterSwitch::new();
        let mut linears: BTreeMap<String, &mut Linear> = linears.into_iter().collect();
        for (name, (a, b)) in self.layers {
            // The embedding is a table lookup here, not a matmul a low-rank update could join.
            if name == "model.embed_tokens" {
                return Err(unsupported(
                    dir,
                    "LoRA on the embedding (`model.embed_tokens`) is not supported",
                ));
            }
            let linear = linears.get_mut(&name).ok_or_else(|| {
                invalid(
                    dir,
                    format!("it adapts `{name}`, which this model does not have"),
                )
            })?;
            // A mixture of experts' projections hold one matrix per expert.
            if linear.weight.ndim() != 2 {
                return Err(unsupported(
                    dir,
                    format!(
                        "LoRA on the experts of a mixture of experts (`{name}`) is not supported"
                    ),
                ));
            }
            let (out_dims, in_dims) = linear_dims(linear);
            let fits = a.ndim() == 2
                && b.ndim() == 2
                && a.dim(0) == in_dims
                && b.shape() == [a.dim(1), out_dims];
            if !fits {
                return Err(invalid(
                    dir,
                    format!(
                        "`{name}`: LoRA shapes {:?} x {:?} do not fit a {in_dims} -> {out_dims} layer \
                         (is this adapter for another model?)",
                        a.shape(),
                        b.shape()
                    ),
                ));
            }
            linear.lora = Some(Lora {
                a,
                b,
                scale: self.scale,
                switch: switch.clone(),
            });
        }
        Ok(switch)
    }
}

/// `(out, in)` of a linear layer, unpacking quantized weights.
fn linear_dims(linear: &Linear) -> (i32, i32) {
    let (out, packed) = (linear.weight.dim(0), linear.weight.dim(1));
    match &linear.quantized {
        Some(q) => (out, packed * 32 / q.bits),
        None => (out, packed),
    }
}

fn read_tensors(dir: &Path, file: &str) -> LoadResult<HashMap<String, Array>> {
    let path: PathBuf = dir.join(file);
    if !path.is_file() {
        return Err(EngineError::load(
            LoadErrorKind::NotFound,
            format!("adapter {}: {file} is missing", dir.display()),
        ));
    }
    let tensors =
        Array::load_safetensors(&path).map_err(|e| invalid(dir, format!("{file}: {e}")))?;
    // Read now, so a damaged file fails the load rather than the first generation.
    mlx_rs::transforms::eval(tensors.values()).map_err(|e| invalid(dir, format!("{file}: {e}")))?;
    Ok(tensors)
}

/// Which matrix of a layer's update a tensor is.
enum Half {
    A,
    B,
}

/// Sorts an adapter file's tensors into `layer -> (a, b)`; `half` tells each tensor's layer
/// and half (`None`: not a LoRA weight, refused).
fn pair_up(
    dir: &Path,
    tensors: HashMap<String, Array>,
    half: impl Fn(&str, Array) -> Option<(String, Half, Array)>,
) -> LoadResult<BTreeMap<String, (Array, Array)>> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    for (name, t) in tensors {
        match half(&name, t) {
            Some((layer, Half::A, t)) => a.insert(layer, t),
            Some((layer, Half::B, t)) => b.insert(layer, t),
            None => {
                return Err(unsupported(
                    dir,
                    format!("tensor `{name}` is not a LoRA weight"),
                ))
            }
        };
    }
    let mut out = BTreeMap::new();
    for (layer, a) in a {
        let b = b
            .remove(&layer)
            .ok_or_else(|| invalid(dir, format!("`{layer}` has a LoRA `a` matrix but no `b`")))?;
        out.insert(layer, (a, b));
    }
    if let Some(layer) = b.keys().next() {
        return Err(invalid(
            dir,
            format!("`{layer}` has a LoRA `b` matrix but no `a`"),
        ));
    }
    if out.is_empty() {
        return Err(invalid(dir, "it holds no LoRA weights"));
    }
    Ok(out)
}
