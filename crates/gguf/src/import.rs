//! GGUF -> Hugging Face-layout directory.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};
use serde_json::{json, Value};

use crate::arch::{Architecture, Hyperparameters, Transform};
use crate::tokenizer::{tokenizer_from_gguf, vocabulary, SpecialTokens};
use crate::{GgufError, GgufFile, ImportError, TensorInfo};

/// What [`import_hf_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// `general.architecture` of the source.
    pub architecture: String,
    /// Number of tensors in `model.safetensors`.
    pub tensors_written: usize,
    /// Number of parameters in `model.safetensors`.
    pub parameters: u64,
    /// Whether the output head reuses the embedding (no `output.weight` in the GGUF).
    pub tied_embeddings: bool,
    /// Rows of the embedding.
    pub vocab_size: usize,
    /// The files written, in the order written.
    pub files: Vec<PathBuf>,
}

/// Converts the GGUF at `gguf` into a Hugging Face-layout model directory at `out` (created if
/// missing; files already there are replaced): `config.json`, `generation_config.json`,
/// `tokenizer.json`, `tokenizer_config.json` and float32 `model.safetensors`.
///
/// Weights are dequantized to f32 one tensor at a time while writing, so memory stays near
/// the size of the largest tensor.
pub fn import_hf_dir(gguf: &Path, out: &Path) -> Result<ImportReport, ImportError> {
    let file = GgufFile::open(gguf)?;
    let arch = Architecture::of(&file)?;
    let hp = arch.hyperparameters(&file)?;
    let plan = plan_tensors(&file, arch, &hp)?;

    let embed = file
        .tensor("token_embd.weight")
        .ok_or_else(|| GgufError::MissingTensor("token_embd.weight".into()))?;
    let vocab_size = embed.shape()[0];
    let tied_embeddings = file.tensor("output.weight").is_none();
    let special = SpecialTokens::from_gguf(&file)?;
    let tokens = vocabulary(&file)?;
    if tokens.len() > vocab_size {
        return Err(ImportError::Inconsistent(format!(
            "{} tokens but the embedding has only {vocab_size} rows",
            tokens.len()
        )));
    }
    let tokenizer = tokenizer_from_gguf(&file)?;

    fs::create_dir_all(out).map_err(|source| ImportError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();

    let mut config = arch.config(&hp);
    config.insert("vocab_size".into(), json!(vocab_size));
    config.insert("tie_word_embeddings".into(), json!(tied_embeddings));
    let chat_template: Option<String> = file.get_as("tokenizer.chat_template")?;
    let eos = stop_tokens(&file, arch, &special, &tokens, chat_template.as_deref())?;
    config.insert("bos_token_id".into(), json!(special.bos));
    config.insert("eos_token_id".into(), eos.clone());
    if let Some(pad) = special.pad {
        config.insert("pad_token_id".into(), json!(pad));
    }
    config.insert("torch_dtype".into(), json!("float32"));
    files.push(write_json(out, "config.json", &Value::Object(config))?);

    let generation = json!({ "bos_token_id": special.bos, "eos_token_id": eos });
    files.push(write_json(out, "generation_config.json", &generation)?);

    let tokenizer_path = out.join("tokenizer.json");
    tokenizer
        .save(&tokenizer_path, false)
        .map_err(|e| ImportError::Tokenizer(format!("saving {}: {e}", tokenizer_path.display())))?;
    files.push(tokenizer_path);

    let max_length: usize = hp.context_length;
    files.push(write_json(
        out,
        "tokenizer_config.json",
        &tokenizer_config(&special, &tokens, chat_template, max_length),
    )?);

    let parameters = plan.iter().map(|t| t.info.n_elements()).sum();
    let tensors_written = plan.len();
    files.push(write_safetensors(
        &file,
        plan,
        &out.join("model.safetensors"),
    )?);

    Ok(ImportReport {
        architecture: arch.name().to_owned(),
        tensors_written,
        parameters,
        tied_embeddings,
        vocab_size,
        files,
    })
}

/// One tensor on its way to the safetensors file.
struct PlannedTensor<'a> {
    info: &'a TensorInfo,
    hf_name: String,
    shape: Vec<usize>,
    transform: Transform,
}

/// Maps every GGUF tensor to its destination and checks the checkpoint is complete.
fn plan_tensors<'a>(
    file: &'a GgufFile,
    arch: Architecture,
    hp: &Hyperparameters,
) -> Result<Vec<PlannedTensor<'a>>, ImportError> {
    let mut plan = Vec::new();
    for info in file.tensors() {
        let target = arch
            .target(&info.name, hp)
            .ok_or_else(|| ImportError::UnmappedTensor(info.name.clone()))?;
        if target.transform == Transform::Drop {
            continue;
        }
        let mut shape = info.shape();
        if target.transform == Transform::AddChannelAxis {
            if shape.len() != 2 {
                return Err(ImportError::Inconsistent(format!(
                    "{} has shape {shape:?}, not (channels, kernel)",
                    info.name
                )));
            }
            shape.insert(1, 1);
        }
        if let Transform::UnpermuteHeads(heads) = target.transform {
            let rows = shape.first().copied().unwrap_or(0);
            if shape.len() != 2 || heads == 0 || rows % (2 * heads) != 0 {
                return Err(ImportError::Inconsistent(format!(
                    "{} has shape {shape:?}, which does not split into {heads} heads of even size",
                    info.name
                )));
            }
        }
        plan.push(PlannedTensor {
            info,
            hf_name: target.hf_name,
            shape,
            transform: target.transform,
        });
    }
    let present: BTreeSet<&str> = plan.iter().map(|t| t.hf_name.as_str()).collect();
    if let Some(missing) = arch
        .required_tensors(hp)
        .into_iter()
        .find(|name| !present.contains(name.as_str()))
    {
        return Err(ImportError::Inconsistent(format!(
            "the GGUF has no tensor for {missing} (the metadata promises {} layers)",
            hp.num_layers
        )));
    }
    Ok(plan)
}

/// The ids that end generation: `eos`, then `eot` when the file names a different one, then
/// `<end_of_turn>` for Gemma 3 or when the chat template closes turns with it (Gemma's turns end
/// with it, not with `<eos>`; Hugging Face's Gemma 3 generation configs list both, and a base
/// model's GGUF carries no template to tell). One id is written as a number, several as a list.
fn stop_tokens(
    file: &GgufFile,
    arch: Architecture,
    special: &SpecialTokens,
    tokens: &[String],
    chat_template: Option<&str>,
) -> Result<Value, ImportError> {
    let mut ids: Vec<u32> = special.eos.into_iter().collect();
    let eot: Option<u32> = file.get_as("tokenizer.ggml.eot_token_id")?;
    let turns_end =
        arch == Architecture::Gemma3 || chat_template.is_some_and(|t| t.contains(END_OF_TURN));
    let end_of_turn = turns_end
        .then(|| tokens.iter().position(|t| t == END_OF_TURN))
        .flatten()
        .map(|id| id as u32);
    for id in eot.into_iter().chain(end_of_turn) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(match ids.as_slice() {
        [] => Value::Null,
        [one] => json!(one),
        _ => json!(ids),
    })
}

/// Gemma's end-of-turn marker.
const END_OF_TURN: &str = "<end_of_turn>";

fn tokenizer_config(
    special: &SpecialTokens,
    tokens: &[String],
    chat_template: Option<String>,
    model_max_length: usize,
) -> Value {
    let text = |id: Option<u32>| id.and_then(|id| tokens.get(id as usize)).cloned();
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": special.add_bos,
        "add_eos_token": special.add_eos,
        "clean_up_tokenization_spaces": false,
        "model_max_length": model_max_length,
    });
    let map = config.as_object_mut().expect("object literal");
    for (key, id) in [
        ("bos_token", special.bos),
        ("eos_token", special.eos),
        ("pad_token", special.pad),
        ("unk_token", special.unk),
    ] {
        if let Some(token) = text(id) {
            map.insert(key.into(), json!(token));
        }
    }
    if let Some(template) = chat_template {
        map.insert("chat_template".into(), json!(template));
    }
    config
}

fn write_json(dir: &Path, name: &str, value: &Value) -> Result<PathBuf, ImportError> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    fs::write(&path, text + "\n").map_err(|source| ImportError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// A tensor that dequantizes itself when the safetensors writer asks for its bytes.
struct LazyTensor<'a> {
    file: &'a GgufFile,
    planned: PlannedTensor<'a>,
    /// The writer cannot report errors from `View::data`, so the first one is parked here.
    error: &'a RefCell<Option<GgufError>>,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.planned.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut values = vec![0.0f32; self.planned.info.n_elements() as usize];
        if let Err(e) = self.file.dequantize_into(self.planned.info, &mut values) {
            self.error.borrow_mut().get_or_insert(e);
        }
        match self.planned.transform {
            Transform::None | Transform::AddChannelAxis | Transform::Drop => {}
            Transform::UnpermuteHeads(heads) => {
                let cols = self.planned.shape[1];
                values = unpermute_rows(&values, heads, cols);
            }
            Transform::SubtractOne => values.iter_mut().for_each(|v| *v -= 1.0),
        }
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.planned.info.n_elements() as usize * 4
    }
}

fn write_safetensors(
    file: &GgufFile,
    plan: Vec<PlannedTensor<'_>>,
    path: &Path,
) -> Result<PathBuf, ImportError> {
    let error = RefCell::new(None);
    let views = plan.into_iter().map(|planned| {
        let name = planned.hf_name.clone();
        (
            name,
            LazyTensor {
                file,
                planned,
                error: &error,
            },
        )
    });
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let written = safetensors::serialize_to_file(views, Some(metadata), path);
    if let Some(e) = error.into_inner() {
        let _ = fs::remove_file(path);
        return Err(e.into());
    }
    written.map_err(|source| ImportError::Safetensors {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(path.to_path_buf())
}

/// Undoes llama.cpp's q/k row permutation.
///
/// llama.cpp's converter regroups each head's rows so that rotary pairs are adjacent (it views
/// a head's rows as `(2, head_dim/2)` and transposes to `(head_dim/2, 2)`). Hugging Face keeps
/// the two halves apart, so row `h*head_dim + j*(head_dim/2) + i` of the result is row
/// `h*head_dim + 2*i + j` of the input.
pub(crate) fn unpermute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let dst = h * head_dim + j * half + i;
                let src = h * head_dim + 2 * i + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
