//! LoRA and DoRA adapters (`lora.rs`): reading one from disk and adding its updates to a
//! model's linear layers, with a switch that turns them all off for one generation
//! (`use_adapter: false`).
//!
//! Two layouts are read:
//! - mlx-lm's (`mlx_lm.lora` writes it): `adapter_config.json` with `fine_tune_type` (`lora` or
//!   `dora`) and `lora_parameters.scale`, and `adapters.safetensors` holding `<layer>.lora_a`
//!   `(in, r)`, `<layer>.lora_b` `(r, out)` and, for DoRA, the magnitude `<layer>.m` `(out,)`.
//! - PEFT's (Unsloth and transformers write it): `adapter_config.json` with `peft_type: LORA`,
//!   `r`, `lora_alpha`, `use_rslora`, `use_dora`, and `adapter_model.safetensors` holding
//!   `base_model.model.<layer>.lora_A.weight` `(r, in)`, `.lora_B.weight` `(out, r)` and, for
//!   DoRA, `.lora_magnitude_vector` `(out,)`.
//!
//! The LoRA update is mlx-lm's `LoRALinear`: `y + (scale * ((x @ a) @ b)).astype(x.dtype)`.
//! DoRA is mlx-lm's unfused `DoRALinear`: that sum, over the dequantized weight, times
//! `m / ||W + scale (a b)^T||` per output row, then the bias.
//! On a mixture of experts' stacked experts (mlx-lm's `LoRASwitchLinear`), `lora_a`
//! `(experts, r, in)` and `lora_b` `(experts, out, r)` run through the experts' gathered matmuls.
//! Full fine-tunes, adapters on the embedding, DoRA on experts (mlx-lm has none) and PEFT
//! extras (`modules_to_save`, per-module ranks) are refused by name.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use mlx_rs::{
    linalg::{norm_l2, NormOptions},
    Array, Axes, Dtype,
};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::{
        array::Result,
        linear::Linear,
        lora::{weak_scale, AdapterSwitch, Lora},
        parallel::Split,
    },
};

/// DoRA's row scale `m / ||W + (scale b^T) a^T||` (L2 norm of each output row), as mlx-lm's
/// `DoRALinear` computes it; without a stored `m`, mlx-lm's default, the base rows' norms in
/// float32.
fn dora_norm_scale(
    linear: &Linear,
    a: &Array,
    b: &Array,
    scale: f32,
    m: Option<Array>,
) -> Result<Array> {
    let row_norms = |w: &Array| {
        norm_l2(
            w,
            NormOptions {
                axes: Axes::Axis(1),
                keep_dims: false,
            },
        )
    };
    let w = linear.dense_weight()?;
    let m = match m {
        Some(m) => m,
        None => row_norms(&w.as_dtype(Dtype::Float32)?)?,
    };
    let delta = weak_scale(scale, b)?.multiply(b.t())?.matmul(a.t())?;
    let norm_scale = m.divide(row_norms(&w.add(delta)?)?)?;
    norm_scale.eval()?;
    Ok(norm_scale)
}

/// One adapted layer as the file holds it.
#[derive(Default)]
struct Update {
    /// `(in, r)`.
    a: Option<Array>,
    /// `(r, out)`.
    b: Option<Array>,
    /// DoRA's magnitude, `(out,)`.
    m: Option<Array>,
}

/// An adapter read from disk, not yet attached.
pub struct Adapter {
    layers: BTreeMap<String, Update>,
    scale: f32,
    dora: bool,
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
        if kind != "lora" && kind != "dora" {
            return Err(unsupported(
                dir,
                format!(
                    "fine_tune_type `{kind}` is not supported; only lora and dora adapters are"
                ),
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
        let layers = sort_out(dir, tensors, |name, t| match name.rsplit_once('.')? {
            (layer, "lora_a") => Some((layer.to_owned(), Part::A, t)),
            (layer, "lora_b") => Some((layer.to_owned(), Part::B, t)),
            (layer, "m") => Some((layer.to_owned(), Part::M, t)),
            _ => None,
        })?;
        let dora = kind == "dora";
        Ok(Self {
            layers,
            scale,
            dora,
        })
    }

    fn load_peft(dir: &Path, config: &Value) -> LoadResult<Self> {
        let peft_type = config["peft_type"].as_str().unwrap_or_default();
        if peft_type != "LORA" {
            return Err(unsupported(
                dir,
                format!("peft_type `{peft_type}` is not supported; only LORA is"),
            ));
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
        let layers = sort_out(dir, tensors, |name, t| {
            let inner = name.strip_prefix("base_model.model.").unwrap_or(name);
            let (layer, part) = [
                (".lora_A.weight", Part::A),
                (".lora_B.weight", Part::B),
                (".lora_magnitude_vector", Part::M),
            ]
            .into_iter()
            .find_map(|(suffix, part)| Some((inner.strip_suffix(suffix)?, part)))?;
            let t = match part {
                Part::M => t,
                _ => t.t(),
            };
            Some((layer.to_owned(), part, t))
        })?;
        let dora = config["use_dora"].as_bool() == Some(true);
        Ok(Self {
            layers,
            scale,
            dora,
        })
    }

    /// Keeps the updates of the layers `keep` names (a pipeline stage's own).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.layers.retain(|name, _| keep(name));
    }

    /// Adds the updates to `linears` (the model's, by checkpoint name); returns the switch.
    pub fn attach(
        mut self,
        dir: &Path,
        linears: Vec<(String, &mut Linear)>,
    ) -> LoadResult<AdapterSwitch> {
        let switch = AdapterSwitch::new();
        let mut linears: BTreeMap<String, &mut Linear> = linears.into_iter().collect();
        while let Some((name, update)) = self.layers.pop_first() {
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
            linear.lora = Some(Box::new(
                self.update_of(dir, &name, linear, update, &switch)?,
            ));
        }
        Ok(switch)
    }

    /// `linear`'s update from the file's tensors, checked against the layer.
    fn update_of(
        &self,
        dir: &Path,
        name: &str,
        linear: &Linear,
        update: Update,
        switch: &AdapterSwitch,
    ) -> LoadResult<Lora> {
        let (a, b, m) = match update {
            Update {
                a: Some(a),
                b: Some(b),
                m,
            } => (a, b, m),
            Update { a: None, .. } => {
                return Err(invalid(dir, format!("`{name}` has no LoRA `a` matrix")))
            }
            Update { b: None, .. } => {
                return Err(invalid(dir, format!("`{name}` has no LoRA `b` matrix")))
            }
        };
        if m.is_some() && !self.dora {
            return Err(invalid(
                dir,
                format!(
                    "`{name}` has a DoRA magnitude but adapter_config.json does not ask for \
                     DoRA (`fine_tune_type: dora` or `use_dora: true`)"
                ),
            ));
        }
        // A mixture of experts' projections hold one matrix per expert: mlx-lm's file has
        // `lora_a (experts, r, in)`, `lora_b (experts, out, r)`, used swapped.
        let experts = linear.weight.ndim() == 3;
        if experts && self.dora {
            return Err(unsupported(
                dir,
                format!(
                    "DoRA on the experts of a mixture of experts (`{name}`) is not supported \
                     (mlx-lm does not support it either)"
                ),
            ));
        }
        let (a, b) = match experts {
            true => (
                a.swap_axes(-1, -2).map_err(|e| invalid(dir, e))?,
                b.swap_axes(-1, -2).map_err(|e| invalid(dir, e))?,
            ),
            false => (a, b),
        };
        // A layer tensor parallel split takes this rank's part of the update: of `b`'s output
        // columns where it keeps part of the outputs; of `a`'s input rows where it keeps part
        // of the inputs (each rank's `(x a) b` is then summed with the layer's outputs, which
        // gives the whole update).
        let cut = |e| {
            invalid(
                dir,
                format!("`{name}`: its update cannot be split like the layer over the ranks: {e}"),
            )
        };
        let (a, b) = match linear.split {
            None => (a, b),
            Some(_) if self.dora => {
                return Err(unsupported(
                    dir,
                    format!(
                        "DoRA on a layer tensor parallel splits (`{name}`) is not supported: \
                         its rescaling needs whole rows; use parallel \"pipeline\""
                    ),
                ))
            }
            Some(split @ Split::Rows { .. }) => (a, split.part_of(&b, -1).map_err(cut)?),
            Some(split @ Split::Columns { .. }) => (split.part_of(&a, -2).map_err(cut)?, b),
        };
        // `(out, in)`; `dims` reads stacked experts' weights as `(experts, in)`.
        let (out_dims, in_dims) = (linear.weight.dim(-2), linear.dims().1);
        let lead = &linear.weight.shape()[..linear.weight.ndim() - 2];
        let rank = a.shape().last().copied().unwrap_or(0);
        let fits = a.shape() == [lead, &[in_dims, rank]].concat()
            && b.shape() == [lead, &[rank, out_dims]].concat()
            && m.as_ref().is_none_or(|m| m.shape() == [out_dims]);
        if !fits {
            let m_shape = m.as_ref().map(|m| m.shape().to_vec());
            return Err(invalid(
                dir,
                format!(
                    "`{name}`: adapter shapes a {:?}, b {:?}, magnitude {m_shape:?} do not fit a \
                     {in_dims} -> {out_dims} layer (is this adapter for another model?)",
                    a.shape(),
                    b.shape()
                ),
            ));
        }
        let dora = match self.dora {
            true => Some(
                dora_norm_scale(linear, &a, &b, self.scale, m)
                    .map_err(|e| invalid(dir, format!("`{name}`: {e}")))?,
            ),
            false => None,
        };
        Ok(Lora::new(a, b, self.scale, dora, switch.clone()))
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

/// Which part of a layer's update a tensor is.
enum Part {
    A,
    B,
    /// DoRA's magnitude.
    M,
}

/// Sorts an adapter file's tensors by layer; `part` tells each tensor's layer and part
/// (`None`: not an adapter weight, refused).
/// A layer of a multimodal checkpoint's language model under the name the model gives it
/// (`model.layers.N...`): adapters trained on the whole checkpoint name it under
/// `language_model.` (mlx-lm's and mlx-vlm's wrappers) or `model.language_model.` (PEFT on
/// transformers 5's classes).
fn language_model_layer(layer: String) -> String {
    if let Some(rest) = layer.strip_prefix("language_model.") {
        return rest.to_owned();
    }
    match layer.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => layer,
    }
}

fn sort_out(
    dir: &Path,
    tensors: HashMap<String, Array>,
    part: impl Fn(&str, Array) -> Option<(String, Part, Array)>,
) -> LoadResult<BTreeMap<String, Update>> {
    let mut out: BTreeMap<String, Update> = BTreeMap::new();
    for (name, t) in tensors {
        let Some((layer, part, t)) = part(&name, t) else {
            return Err(unsupported(
                dir,
                format!("tensor `{name}` is not a LoRA or DoRA weight"),
            ));
        };
        let update = out.entry(language_model_layer(layer)).or_default();
        match part {
            Part::A => update.a = Some(t),
            Part::B => update.b = Some(t),
            Part::M => update.m = Some(t),
        }
    }
    if out.is_empty() {
        return Err(invalid(dir, "it holds no LoRA weights"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_checkpoints_layers_are_named_as_its_language_model_names_them() {
        let name = |n: &str| language_model_layer(n.to_owned());
        let layer = "model.layers.0.self_attn.q_proj";
        assert_eq!(
            name("language_model.model.layers.0.self_attn.q_proj"),
            layer
        );
        assert_eq!(
            name("model.language_model.layers.0.self_attn.q_proj"),
            layer
        );
        assert_eq!(name(layer), layer);
        assert_eq!(name("language_model.lm_head"), "lm_head");
    }
}
