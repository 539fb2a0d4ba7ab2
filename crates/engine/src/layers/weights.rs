//! A checkpoint's tensors by name, with the layer builders every model file uses.
//!
//! A layer is quantized when `<name>.scales` exists (MLX's checkpoint convention); its bits and
//! group size come from config.json's `quantization`, with per-layer overrides.

use std::{collections::HashMap, path::Path};

use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::parallel::Placement,
    layers::{
        embedding::Embedding, linear::Linear, norm::LayerNorm, norm::RmsNorm, quantized::QuantMode,
        quantized::Quantized,
    },
};

/// Tensors of a checkpoint, taken out one by one by the model being built.
pub struct Weights {
    tensors: HashMap<String, Array>,
    quantization: Option<Value>,
    /// What was cut off these names by [`Weights::split_off`]: config.json's per-layer
    /// quantization overrides name layers by their full checkpoint path.
    path_prefix: String,
    /// This rank's share when the model is split over a group; the shared decoder takes it.
    placement: Option<Placement>,
    /// Name parts renamed by [`Weights::rename_parts`], (checkpoint's, ours): per-layer
    /// quantization overrides name layers as the checkpoint does.
    renamed: Vec<(String, String)>,
}

/// `name` (ours, a dotted path) with each part `parts` renamed given back its checkpoint name:
/// `parts` is (checkpoint's, ours), as [`Weights::rename_parts`] took it.
pub fn checkpoint_name(name: &str, parts: &[(String, String)]) -> String {
    let back = parts
        .iter()
        .map(|(theirs, ours)| (ours.as_str(), theirs.as_str()));
    replace_parts(name, back)
}

/// `name` with each dotted part `from` replaced by `to`, at its first place.
fn replace_parts<'a>(name: &str, parts: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut dotted = format!(".{name}.");
    for (from, to) in parts {
        dotted = dotted.replacen(&format!(".{from}."), &format!(".{to}."), 1);
    }
    dotted[1..dotted.len() - 1].to_owned()
}

type LoadResult<T> = Result<T, EngineError>;

/// A load error for weights that are not what config.json describes.
pub(crate) fn invalid(detail: impl Into<String>) -> EngineError {
    EngineError::load(LoadErrorKind::InvalidWeights, detail)
}

/// config.json's `quantization`, or what mlx-lm reads into it from a Hugging Face
/// `quantization_config` it converts at load (`quant_method` mxfp4: OpenAI's GPT-OSS experts).
pub fn quantization(config: &Value) -> Option<Value> {
    if let Some(q) = config.get("quantization") {
        return Some(q.clone());
    }
    let method = config.get("quantization_config")?.get("quant_method")?;
    (method == "mxfp4").then(|| serde_json::json!({"group_size": 32, "bits": 4, "mode": "mxfp4"}))
}

impl Weights {
    /// Reads every `*.safetensors` file of a model directory (single or sharded).
    pub fn load_dir(dir: &Path, config: &Value) -> LoadResult<Self> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| {
                EngineError::load(LoadErrorKind::NotFound, format!("{}: {e}", dir.display()))
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(EngineError::load(
                LoadErrorKind::NotFound,
                format!(
                    "no *.safetensors in {}: is this a model directory?",
                    dir.display()
                ),
            ));
        }
        let mut tensors = HashMap::new();
        for file in &files {
            let part = Array::load_safetensors(file)
                .map_err(|e| invalid(format!("{}: {e}", file.display())))?;
            tensors.extend(part);
        }
        Ok(Self {
            tensors,
            quantization: quantization(config),
            path_prefix: String::new(),
            placement: None,
            renamed: Vec::new(),
        })
    }

    /// A checkpoint from tensors in memory (tests).
    #[cfg(test)]
    pub fn from_tensors(tensors: HashMap<String, Array>, config: &Value) -> Self {
        Self {
            tensors,
            quantization: quantization(config),
            path_prefix: String::new(),
            placement: None,
            renamed: Vec::new(),
        }
    }

    /// Names left, for checks and `sanitize` steps.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    /// The shape of tensor `name`, if the checkpoint holds it.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[i32]> {
        self.tensors.get(name).map(Array::shape)
    }

    /// How many layers `{prefix}N.` the checkpoint holds (distinct `N`).
    pub fn count_indexed(&self, prefix: &str) -> usize {
        let indices: std::collections::HashSet<&str> = self
            .tensors
            .keys()
            .filter_map(|n| n.strip_prefix(prefix)?.split_once('.'))
            .map(|(index, _)| index)
            .filter(|index| index.parse::<u64>().is_ok())
            .collect();
        indices.len()
    }

    /// Drops a tensor the model does not use (e.g. rotary `inv_freq`).
    pub fn remove(&mut self, name: &str) -> Option<Array> {
        self.tensors.remove(name)
    }

    /// Adds a tensor under `name` (a family's `sanitize` step: a tensor split or renamed).
    pub fn insert(&mut self, name: String, tensor: Array) {
        self.tensors.insert(name, tensor);
    }

    /// Takes a tensor that must exist.
    pub fn take(&mut self, name: &str) -> LoadResult<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| invalid(format!("the checkpoint has no tensor `{name}`")))
    }

    /// The quantization settings for a layer: per-layer override, else the global one.
    fn quant_params(&self, prefix: &str) -> LoadResult<(i32, i32, QuantMode)> {
        let q = self.quantization.as_ref().ok_or_else(|| {
            invalid(format!(
                "`{prefix}.scales` exists but config.json has no `quantization`"
            ))
        })?;
        let path = format!(
            "{}{}",
            self.path_prefix,
            checkpoint_name(prefix, &self.renamed)
        );
        let layer = q.get(&path).filter(|v| v.is_object()).unwrap_or(q);
        let get =
            |k: &str, default: i64| layer.get(k).and_then(Value::as_i64).unwrap_or(default) as i32;
        // A layer's own settings name its mode, else affine (mlx's `to_quantized` default).
        let name = layer.get("mode").and_then(Value::as_str);
        let mode = QuantMode::parse(name.unwrap_or("affine")).ok_or_else(|| {
            EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!(
                    "`{path}`: quantization mode `{}` is not supported; affine and mxfp4 are",
                    name.unwrap_or_default()
                ),
            )
        })?;
        let (group_size, bits) = (get("group_size", 64), get("bits", 4));
        // Sizes are divided by both: a damaged config must fail here, not divide by zero.
        if !(1..=8).contains(&bits) || group_size <= 0 {
            return Err(invalid(format!(
                "`{path}`: quantization bits {bits} / group_size {group_size} are not what MLX \
                 quantizes (1-8 bits, groups of 32, 64 or 128)"
            )));
        }
        Ok((group_size, bits, mode))
    }

    /// A linear layer at `prefix` (`prefix.weight`, optional `.bias`, `.scales`/`.biases`).
    pub fn linear(&mut self, prefix: &str) -> LoadResult<Linear> {
        let weight = self.take(&format!("{prefix}.weight"))?;
        let bias = self.tensors.remove(&format!("{prefix}.bias"));
        let quantized = match self.tensors.remove(&format!("{prefix}.scales")) {
            Some(scales) => {
                let (group_size, bits, mode) = self.quant_params(prefix)?;
                let biases = match mode {
                    QuantMode::Affine => Some(self.take(&format!("{prefix}.biases"))?),
                    QuantMode::Mxfp4 => None,
                };
                Some(Quantized {
                    scales,
                    biases,
                    group_size,
                    bits,
                    mode,
                })
            }
            None => None,
        };
        Ok(Linear {
            weight,
            bias,
            quantized,
            lora: None,
            split: None,
        })
    }

    pub fn embedding(&mut self, prefix: &str) -> LoadResult<Embedding> {
        Ok(Embedding {
            table: self.linear(prefix)?,
        })
    }

    pub fn rms_norm(&mut self, prefix: &str, eps: f32) -> LoadResult<RmsNorm> {
        Ok(RmsNorm {
            weight: self.take(&format!("{prefix}.weight"))?,
            eps,
        })
    }

    pub fn layer_norm(&mut self, prefix: &str, eps: f32) -> LoadResult<LayerNorm> {
        Ok(LayerNorm {
            weight: self.take(&format!("{prefix}.weight"))?,
            bias: Some(self.take(&format!("{prefix}.bias"))?),
            eps,
        })
    }

    /// A layer norm whose offset (`<prefix>.bias`) is taken where the checkpoint has one.
    pub fn layer_norm_maybe_offset(&mut self, prefix: &str, eps: f32) -> LoadResult<LayerNorm> {
        Ok(LayerNorm {
            weight: self.take(&format!("{prefix}.weight"))?,
            bias: self.tensors.remove(&format!("{prefix}.bias")),
            eps,
        })
    }

    /// Splits the model these weights build over a group ([`Placement`]).
    pub fn set_placement(&mut self, placement: Option<Placement>) {
        self.placement = placement;
    }

    /// The placement, for the decoder that builds the split model.
    pub fn take_placement(&mut self) -> Option<Placement> {
        self.placement.take()
    }

    /// Drops every tensor under `prefix` unread (a layer another rank runs).
    pub fn drop_prefixed(&mut self, prefix: &str) {
        self.tensors.retain(|name, _| !name.starts_with(prefix));
    }

    /// Renames every tensor that starts with `from` to start with `to` instead (checkpoint
    /// layouts that put a model's parts under other prefixes).
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        for (rest, t) in self.take_prefixed(from) {
            self.tensors.insert(format!("{to}{rest}"), t);
        }
    }

    /// Renames the dotted parts of every tensor's name that a checkpoint names its own way,
    /// each (checkpoint's, ours) at its first place in a name (`feed_forward.w1` ->
    /// `mlp.gate_proj`), so that the shared decoder finds them.
    pub fn rename_parts(&mut self, parts: &[(&str, &str)]) {
        self.sanitize_parts(parts);
        let owned = parts.iter().map(|(a, b)| (a.to_string(), b.to_string()));
        self.renamed.extend(owned);
    }

    /// Renames parts as [`Weights::rename_parts`] does, where the reference's `sanitize` renames
    /// them too: the new names are the checkpoint's from then on (for per-layer quantization
    /// and adapters), so no record is kept.
    pub fn sanitize_parts(&mut self, parts: &[(&str, &str)]) {
        let names: Vec<String> = self.tensors.keys().cloned().collect();
        for name in names {
            let renamed = replace_parts(&name, parts.iter().copied());
            if renamed != name {
                let tensor = self.tensors.remove(&name).expect("listed above");
                self.tensors.insert(renamed, tensor);
            }
        }
    }

    /// The parts [`Weights::rename_parts`] renamed, (checkpoint's, ours).
    pub fn renamed_parts(&self) -> &[(String, String)] {
        &self.renamed
    }

    /// Moves the tensors under `prefix` into their own `Weights`, without the prefix (a
    /// vision-language checkpoint's vision tower, its language model).
    pub fn split_off(&mut self, prefix: &str) -> Weights {
        let tensors = self.take_prefixed(prefix).collect();
        Weights {
            tensors,
            quantization: self.quantization.clone(),
            path_prefix: format!("{}{prefix}", self.path_prefix),
            placement: None,
            renamed: self.renamed.clone(),
        }
    }

    /// Takes out the tensors whose names start with `prefix`: (the rest of the name, tensor).
    fn take_prefixed(&mut self, prefix: &str) -> impl Iterator<Item = (String, Array)> {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        let taken: Vec<(String, Array)> = names
            .into_iter()
            .map(|n| {
                let t = self.tensors.remove(&n).expect("listed above");
                (n[prefix.len()..].to_owned(), t)
            })
            .collect();
        taken.into_iter()
    }

    /// Casts every floating tensor, except quantization scales and biases, to `dtype`.
    pub fn cast_floats(&mut self, dtype: Dtype) -> LoadResult<()> {
        for (name, t) in self.tensors.iter_mut() {
            let is_float = matches!(t.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16);
            let is_quant_param = name.ends_with(".scales") || name.ends_with(".biases");
            if is_float && !is_quant_param && t.dtype() != dtype {
                *t = t
                    .as_dtype(dtype)
                    .map_err(|e| invalid(format!("{name}: {e}")))?;
            }
        }
        Ok(())
    }

    /// The dtype of the first floating tensor (the checkpoint's compute dtype).
    pub fn float_dtype(&self) -> Option<Dtype> {
        self.tensors
            .values()
            .map(Array::dtype)
            .find(|d| matches!(d, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16))
    }

    /// Bytes the tensors take once materialised, in their current dtypes.
    pub fn nbytes(&self) -> u64 {
        self.tensors.values().map(|t| t.nbytes() as u64).sum()
    }

    /// Parameters of the model as trained: packed quantized weights count as unpacked, and
    /// quantization scales and biases do not count (OpenAI's MXFP4 `_blocks` hold two 4-bit
    /// values a byte, their `_scales` do not count either).
    pub fn num_parameters(&self) -> u64 {
        let is_scale = |n: &str| {
            [".scales", ".biases", "_scales"]
                .iter()
                .any(|s| n.ends_with(s))
        };
        self.tensors
            .iter()
            .filter(|(n, _)| !is_scale(n))
            .map(|(name, t)| {
                let prefix = name.strip_suffix(".weight").unwrap_or(name);
                if name.ends_with("_blocks") {
                    return t.size() as u64 * 2;
                }
                match self.tensors.contains_key(&format!("{prefix}.scales")) {
                    true => {
                        let bits = self.quant_params(prefix).map_or(4, |q| q.1) as u64;
                        t.size() as u64 * 32 / bits
                    }
                    false => t.size() as u64,
                }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use fixtures::mlx_test_lock;
    use serde_json::json;

    use super::*;

    /// LFM2's names: a layer renamed for the decoder keeps its checkpoint name's per-layer
    /// quantization, and maps back to it.
    #[test]
    fn a_renamed_layer_keeps_its_checkpoint_names_quantization() {
        let _lock = mlx_test_lock();
        let config = json!({"quantization": {
            "group_size": 64, "bits": 4,
            "model.layers.0.feed_forward.w1": {"group_size": 32, "bits": 8},
        }});
        let part = |n: &str| (n.to_owned(), Array::from_slice(&[0u32; 4], &[1, 4]));
        let tensors = ["weight", "scales", "biases"]
            .map(|p| part(&format!("model.layers.0.feed_forward.w1.{p}")));
        let mut weights = Weights::from_tensors(tensors.into_iter().collect(), &config);
        let parts = [
            ("feed_forward.w1", "mlp.gate_proj"),
            ("embedding_norm", "norm"),
        ];
        weights.rename_parts(&parts);
        let parts = weights.renamed_parts().to_vec();
        let linear = weights.linear("model.layers.0.mlp.gate_proj").unwrap();
        let q = linear.quantized.expect("quantized");
        assert_eq!((q.group_size, q.bits), (32, 8));
        assert_eq!(
            checkpoint_name("model.layers.0.mlp.gate_proj", &parts),
            "model.layers.0.feed_forward.w1"
        );
        assert_eq!(
            checkpoint_name("model.norm", &parts),
            "model.embedding_norm"
        );
        assert_eq!(checkpoint_name("lm_head", &parts), "lm_head");
    }
}
