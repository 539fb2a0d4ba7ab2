//! `Engine::load`'s steps, in order: [`resolve`] (where the files are), [`read`] (config,
//! tokenizer, chat template), [`build`] (weights into a model), [`quantize`] (quantize-on-load,
//! adapter, `kv_bits` check, weights materialised), [`describe`] (what `load` answers). Each
//! reports its stage; any failure leaves the resident models as they were.

use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde_json::Value;
use text::ModelTokenizer;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::adapter::{self, Adapter},
    layers::kv_cache::{KvCache, KV_GROUP_SIZE},
    layers::lora::AdapterSwitch,
    layers::parallel::Placement,
    layers::weights::Weights,
    models::{self, LanguageModel},
    runtime::request::*,
    runtime::resident::Draft,
    vision::{self, VisionModel},
    CancelToken,
};

/// Where a model's files are.
pub(crate) struct Files {
    /// The model directory (a `.gguf` imported into one).
    pub path: PathBuf,
    /// A LoRA adapter to attach, if any.
    pub adapter: Option<PathBuf>,
    pub is_gguf: bool,
}

/// A model built from its weights, before quantize-on-load and adapters.
pub(crate) struct Built {
    pub model: Box<dyn LanguageModel>,
    /// The vision side of a vision-language model.
    pub vision: Option<Box<dyn VisionModel>>,
    pub dtype: WeightDtype,
    pub num_parameters: u64,
    /// Bytes of the weights as they will be held (priced before MLX reads them).
    pub weight_bytes: u64,
    pub quantization: Option<Quantization>,
    /// Why the `kv_bits` asked for cannot apply to this model (it then runs a plain cache).
    pub kv_bits_refused: Option<String>,
}

/// The model directory and adapter of `req`: a `.gguf` imported, a repo id found or downloaded;
/// an adapter asked for, or the `model` directory is one (then its base is the model).
pub(crate) fn resolve(
    req: &LoadRequest,
    progress: &mut dyn FnMut(LoadProgress),
    cancel: &CancelToken,
) -> Result<Files, EngineError> {
    let is_gguf = req.model.ends_with(".gguf") && Path::new(&req.model).is_file();
    let path = if is_gguf {
        report(progress, LoadStage::Weights, 0, "importing GGUF");
        model_store::gguf_import::imported_dir(Path::new(&req.model))?
    } else {
        find(&req.model, req, progress, cancel)?
    };
    let (path, adapter) = match &req.adapter {
        Some(adapter) => (path, Some(find(adapter, req, progress, cancel)?)),
        None if adapter::is_adapter_dir(&path) => {
            let base = adapter::base_model_of(&path)?;
            (find(&base, req, progress, cancel)?, Some(path))
        }
        None => (path, None),
    };
    report(progress, LoadStage::Resolve, 1, &path.display().to_string());
    Ok(Files {
        path,
        adapter,
        is_gguf,
    })
}

/// config.json and the tokenizer (with `chat_template_override` applied).
pub(crate) fn read(
    files: &Files,
    req: &LoadRequest,
    progress: &mut dyn FnMut(LoadProgress),
    cancel: &CancelToken,
) -> Result<(Value, ModelTokenizer), EngineError> {
    let path = &files.path;
    let config = read_config(path)?;
    report(progress, LoadStage::Tokenizer, 0, "");
    let mut tokenizer = ModelTokenizer::from_dir(path).map_err(|e| {
        EngineError::load(
            LoadErrorKind::TokenizerMissing,
            format!("{}: {e}", path.display()),
        )
    })?;
    if let Some(template) = &req.chat_template_override {
        tokenizer
            .set_chat_template(template, text::ChatTemplateSource::Override)
            .map_err(|e| EngineError::InvalidParams {
                field: "chat_template_override".into(),
                reason: e.to_string(),
            })?;
    }
    if cancel.is_cancelled() {
        return Err(EngineError::Cancelled);
    }
    Ok((config, tokenizer))
}

/// The weights (cast to `req.dtype` when asked) in the family's model; with a `placement`,
/// only this rank's share of it.
pub(crate) fn build(
    files: &Files,
    config: &Value,
    req: &LoadRequest,
    placement: Option<Placement>,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Built, EngineError> {
    report(progress, LoadStage::Weights, 0, "");
    let mut weights = Weights::load_dir(&files.path, config)?;
    if let Some(dtype) = req.dtype {
        weights.cast_floats(to_mlx(dtype))?;
    }
    let dtype = weights
        .float_dtype()
        .map(from_mlx)
        .unwrap_or(WeightDtype::Float32);
    let ranks = placement.as_ref().map_or(1, |p| p.group.size() as u64);
    check_fits(&weights, req.load_in_4bit, ranks)?;
    let num_parameters = weights.num_parameters();
    let weight_bytes = weights.nbytes() / ranks;
    let (vision, text_config) = vision::split(&files.path, config, &mut weights)?;
    let split = placement.is_some();
    if split && vision.is_some() {
        return Err(refuse_parallel(
            "vision-language models are not split over ranks yet: load it without `parallel`",
        ));
    }
    weights.set_placement(placement);
    let model = models::build(&text_config, weights)?;
    if split && model.stage().is_none() {
        return Err(refuse_parallel(format!(
            "`{}` models are not built on the shared decoder and cannot be split",
            text_config["model_type"].as_str().unwrap_or_default()
        )));
    }
    Ok(Built {
        model,
        vision,
        dtype,
        num_parameters,
        weight_bytes,
        quantization: quantization_of(config),
        kv_bits_refused: None,
    })
}

pub(crate) fn refuse_parallel(reason: impl Into<String>) -> EngineError {
    EngineError::InvalidParams {
        field: "parallel".into(),
        reason: reason.into(),
    }
}

/// Refuses weights larger than MLX's memory limit before any is read (MLX reads them lazily):
/// the bytes they take as they will be held, a quarter of that under `load_in_4bit` (16-bit
/// weights to 4 bits). Other residents do not count: the host may unload them, and a model
/// reloaded under its own id replaces itself. A model split over `ranks` needs about its
/// share on each.
fn check_fits(weights: &Weights, load_in_4bit: bool, ranks: u64) -> Result<(), EngineError> {
    let needed = weights.nbytes() / if load_in_4bit { 4 } else { 1 } / ranks;
    match crate::runtime::memory::limit_bytes() {
        Some(limit) if needed > limit => Err(EngineError::load(
            LoadErrorKind::OutOfMemory,
            format!(
                "the weights need {:.2} GB, more than MLX's memory limit of {:.2} GB on this \
                 machine: load a quantized checkpoint or a smaller model",
                needed as f64 / 1e9,
                limit as f64 / 1e9
            ),
        )),
        _ => Ok(()),
    }
}

/// Quantize-on-load (`load_in_4bit`: affine, 4 bits, groups of 64, as mlx-lm), the `kv_bits`
/// check, the adapter attached; then the linear layers' weights (nearly all the bytes)
/// materialised, so that running out of memory shows here and not in the first generation.
/// The rest (embeddings, norms) MLX reads at its first use (docs/traps.md).
pub(crate) fn quantize(
    built: &mut Built,
    files: &Files,
    req: &LoadRequest,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Option<AdapterSwitch>, EngineError> {
    let model = &mut built.model;
    if req.load_in_4bit && built.quantization.is_none() {
        // MLX quantizes lazily: the bytes the layers will hold are known before it does.
        let dense = linear_bytes(model.as_mut());
        quantize_in_4bit(model.as_mut())?;
        let quantized = linear_bytes(model.as_mut());
        built.weight_bytes = (built.weight_bytes + quantized).saturating_sub(dense);
        built.quantization = Some(Quantization {
            bits: 4,
            group_size: 64,
        });
    }
    if let Some(bits) = req.kv_bits {
        let facts = model.facts();
        let refused = check_kv_bits(bits, &facts.quantizable_kv_head_dims)?;
        built.kv_bits_refused = refused.or(facts.kv_bits_refusal);
        if let Some(reason) = &built.kv_bits_refused {
            tracing::warn!(bits, %reason, "loading with a plain KV cache");
        }
    }
    let adapter = match &files.adapter {
        Some(dir) => {
            let mut adapter = Adapter::load(dir)?;
            if let Some(stage) = model.stage() {
                adapter.retain(|name| !stage.held_elsewhere(name));
            }
            Some(adapter.attach(dir, model.linears_mut())?)
        }
        None => None,
    };
    let arrays: Vec<Array> = model
        .linears_mut()
        .into_iter()
        .flat_map(|(_, l)| l.arrays().into_iter().cloned().collect::<Vec<_>>())
        .collect();
    mlx_rs::transforms::eval(arrays.iter()).map_err(|e| {
        let message = crate::error::mlx_message(e.what());
        let kind = if message.starts_with("[read]") {
            LoadErrorKind::InvalidWeights
        } else {
            LoadErrorKind::OutOfMemory
        };
        EngineError::load(kind, format!("materialising weights: {message}"))
    })?;
    report(progress, LoadStage::Weights, 1, "");
    Ok(adapter)
}

/// The drafter of `main` for speculative decoding, loaded with the same token and nothing
/// else: an EAGLE-3 drafter or a block drafter made for `model` (config.json's
/// `dflash_config`: DFlash, DFlash2 or DSpark), or a text model whose tokenizer has the same
/// vocabulary (token ids) as `tokenizer`.
pub(crate) fn draft(
    main: &LoadRequest,
    tokenizer: &ModelTokenizer,
    built: &Built,
    progress: &mut dyn FnMut(LoadProgress),
    cancel: &CancelToken,
) -> Result<Option<(Draft, u64)>, EngineError> {
    let Some(name) = &main.draft_model else {
        return Ok(None);
    };
    let refuse = |reason: String| EngineError::InvalidParams {
        field: "draft_model".into(),
        reason,
    };
    let req = LoadRequest {
        model: name.clone(),
        hf_token: main.hf_token.clone(),
        ..LoadRequest::default()
    };
    let files = resolve(&req, progress, cancel)?;
    let config = read_config(&files.path)?;
    if models::Eagle3::is_eagle3(&config) {
        let weights = Weights::load_dir(&files.path, &config)?;
        let bytes = weights.nbytes();
        let facts = built.model.facts();
        let drafter = models::Eagle3::load(
            &config,
            weights,
            facts.hidden_size,
            facts.layers,
            facts.embedding_rows,
        )?;
        return Ok(Some((Draft::Eagle3(Box::new(drafter)), bytes)));
    }
    if models::DFlash::kind(&config).is_some() {
        let weights = Weights::load_dir(&files.path, &config)?;
        let bytes = weights.nbytes();
        let facts = built.model.facts();
        let drafter = models::DFlash::load(&config, weights, facts.hidden_size, facts.layers)?;
        if drafter.mask_token as i64 >= i64::from(facts.embedding_rows) {
            return Err(refuse(format!(
                "{name}'s mask token {} is not in the model's vocabulary: the drafter was made \
                 for another model",
                drafter.mask_token
            )));
        }
        return Ok(Some((Draft::Block(Box::new(drafter)), bytes)));
    }
    if built.vision.is_some() {
        return Err(refuse(
            "speculative decoding with a draft model is for text models (a DFlash drafter or the \
             model's own multi-token-prediction head drafts for a vision-language model)"
                .into(),
        ));
    }
    let (config, draft_tokenizer) = read(&files, &req, progress, cancel)?;
    if draft_tokenizer.inner().get_vocab(true) != tokenizer.inner().get_vocab(true) {
        return Err(refuse(format!(
            "{name}'s tokenizer is not the model's (token ids differ): a draft model must share              the model's vocabulary, e.g. a smaller model of the same family"
        )));
    }
    let mut built = build(&files, &config, &req, None, progress)?;
    if built.vision.is_some() {
        return Err(refuse(format!(
            "{name} is a vision-language model: a draft model must be a text model"
        )));
    }
    quantize(&mut built, &files, &req, progress)?;
    Ok(Some((Draft::Model(built.model), built.weight_bytes)))
}

/// What `speculative: {"method": "auto"}` drafts with on `model` loaded beside `draft` (and a KV
/// cache quantized to `kv_bits`), and why: [`Drafts::resolve`]'s choice, or none where drafted
/// positions cannot be taken back.
pub(crate) fn auto_drafter(
    model: &dyn LanguageModel,
    draft: Option<&Draft>,
    kv_bits: Option<u8>,
) -> (Option<Drafts>, String) {
    if kv_bits.is_some() {
        let why = "none: a quantized KV cache (`kv_bits`) cannot take drafted positions back";
        return (None, why.into());
    }
    if !model.make_caches().iter().all(KvCache::can_take_back) {
        let why = "none: this model's sliding-window or chunked layers cannot take drafted \
                   positions back";
        return (None, why.into());
    }
    let depth = model.mtp_depth();
    let method = Drafts::Auto.resolve(depth, draft.is_some());
    let why = match (method, draft) {
        (Drafts::Mtp, _) => {
            format!("the checkpoint's own multi-token-prediction head ({depth} layers)")
        }
        (_, Some(Draft::Block(_))) => {
            "the `draft_model` loaded with it, a DFlash block drafter".into()
        }
        (_, Some(Draft::Eagle3(_))) => {
            "the `draft_model` loaded with it, an EAGLE-3 drafter".into()
        }
        (_, Some(Draft::Model(_))) => "the `draft_model` loaded with it".into(),
        _ => "no drafter beside the model: drafts copied from the prompt and the output (prompt \
              lookup)"
            .into(),
    };
    (Some(method), why)
}

/// `load_in_4bit`: every linear layer whose rows split into groups of 64 (a mixture of
/// experts' stacked expert layers too, each expert's matrix as mlx-lm quantizes them) becomes
/// affine 4-bit, group 64.
pub(crate) fn quantize_in_4bit(model: &mut dyn LanguageModel) -> Result<(), EngineError> {
    for (_, linear) in model.linears_mut() {
        if linear.weight.dim(-1) % 64 == 0 {
            linear.quantize(64, 4)?;
        }
    }
    Ok(())
}

/// Refuses, on the CPU, a mixture of experts whose expert layers are dense and not float32:
/// MLX's CPU `gather_mm` computes float32 only (mlx-lm fails there the same way, at the first
/// token); quantized experts (`gather_qmm`) run in any float dtype.
pub(crate) fn check_experts_run_on(
    model: &mut dyn LanguageModel,
    backend: Backend,
) -> Result<(), EngineError> {
    if backend != Backend::Cpu {
        return Ok(());
    }
    let dense_experts = model.linears_mut().into_iter().find(|(_, l)| {
        l.weight.ndim() == 3 && l.quantized.is_none() && l.weight.dtype() != Dtype::Float32
    });
    match dense_experts {
        Some((name, l)) => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "`{name}` holds {:?} experts, and on the CPU MLX runs unquantized experts in \
                 float32 only: load with `dtype` float32 or with `load_in_4bit`",
                l.weight.dtype()
            ),
        )),
        None => Ok(()),
    }
}

/// Bytes of the linear layers' arrays (as they will be held, where MLX has not computed them
/// yet): nearly all of a model's weights.
pub(crate) fn linear_bytes(model: &mut dyn LanguageModel) -> u64 {
    let linears = model.linears_mut();
    let arrays = linears.iter().flat_map(|(_, l)| l.arrays());
    arrays.map(|a| a.nbytes() as u64).sum()
}

/// The model's output width as config.json gives it.
fn output_width(config: &Value) -> Option<u64> {
    models::text_number(config, "vocab_size")
}

/// What is known about the model, as `load` answers it.
pub(crate) fn describe(
    req: &LoadRequest,
    files: &Files,
    config: &Value,
    tokenizer: &ModelTokenizer,
    built: &Built,
) -> ModelInfo {
    let own_context = built.model.facts().max_position_embeddings.unwrap_or(4096);
    let model_type = config["model_type"].as_str().unwrap_or_default().to_owned();
    ModelInfo {
        model_id: req.model.clone(),
        path: files.path.clone(),
        architecture: model_type.clone(),
        model_type,
        is_vision: built.vision.is_some(),
        is_lora: files.adapter.is_some(),
        is_gguf: files.is_gguf,
        dtype: built.dtype,
        quantization: built.quantization,
        context_length: if req.max_seq_length > 0 {
            req.max_seq_length
        } else {
            own_context
        },
        native_context_length: own_context,
        num_parameters: built.num_parameters,
        // The model's output width (embeddings are often padded past the tokenizer's size):
        // what the sampler's logit-bias row and token checks must match.
        vocab_size: output_width(config).map_or_else(|| tokenizer.vocab_size(), |v| v as usize),
        eos_token_ids: tokenizer.eos_token_ids().iter().copied().collect(),
        chat_template_present: tokenizer.chat_template().is_some(),
        chat_template_text: tokenizer.chat_template().map(|t| t.source().to_owned()),
        special_tokens: tokenizer.special_tokens().clone(),
        display_name: display_name(&req.model),
        kv_bits_requested: req.kv_bits,
        kv_bits: req.kv_bits.filter(|_| built.kv_bits_refused.is_none()),
        kv_bits_reason: built.kv_bits_refused.clone(),
        parallel: None,
        mtp_layers: built.model.mtp_depth(),
        draft_kind: None,
        speculative_auto: (None, String::new()),
        memory: MemoryPlan::default(),
        chat_template_source: match tokenizer.chat_template_source() {
            // The importer carried the GGUF's own template into tokenizer_config.json.
            text::ChatTemplateSource::TokenizerConfig if files.is_gguf => {
                text::ChatTemplateSource::Gguf
            }
            source => source,
        },
    }
}

/// Reports `stage` as begun (`done` 0) or finished (`done` 1).
pub(crate) fn report(
    progress: &mut dyn FnMut(LoadProgress),
    stage: LoadStage,
    done: u64,
    message: &str,
) {
    progress(LoadProgress {
        stage,
        done,
        total: 1,
        message: message.to_owned(),
    });
}

/// A local directory, or a hub repo id's snapshot (`model_store`). `model` is `req.model`, or an
/// adapter or base model named beside it (fetched at its default revision, with the same token).
fn find(
    model: &str,
    req: &LoadRequest,
    progress: &mut dyn FnMut(LoadProgress),
    cancel: &CancelToken,
) -> Result<PathBuf, EngineError> {
    let source = model_store::Source {
        model,
        revision: if model == req.model {
            req.revision.as_deref()
        } else {
            None
        },
        hf_token: req.hf_token.as_ref(),
    };
    Ok(model_store::resolve(&source, progress, &|| {
        cancel.is_cancelled()
    })?)
}

/// `kv_bits` quantizes each cached head in groups of [`KV_GROUP_SIZE`] features. Bits other
/// than 4 or 8 are an error; a model whose heads cannot be grouped so gives the reason it runs
/// a plain cache instead (as Studio's backend does, rather than failing the load).
fn check_kv_bits(bits: u8, head_dims: &[i32]) -> Result<Option<String>, EngineError> {
    if ![4, 8].contains(&bits) {
        return Err(EngineError::InvalidParams {
            field: "kv_bits".into(),
            reason: format!("must be 4 or 8, not {bits}"),
        });
    }
    Ok(head_dims.iter().find(|d| *d % KV_GROUP_SIZE != 0).map(|d| {
        format!(
            "this model's attention heads have {d} features, not a multiple of \
             {KV_GROUP_SIZE}, so its KV cache cannot be quantized"
        )
    }))
}

/// The model's name for people: the last component of `model` (a `.gguf` without its
/// extension).
fn display_name(model: &str) -> String {
    let last = model
        .trim_end_matches(['/', '\\'])
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(model);
    last.strip_suffix(".gguf").unwrap_or(last).to_owned()
}

fn read_config(dir: &Path) -> Result<Value, EngineError> {
    let file = dir.join("config.json");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        EngineError::load(LoadErrorKind::NotFound, format!("{}: {e}", file.display()))
    })?;
    text::python_json::parse_python_json(&text).map_err(|e| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("{}: {e}", file.display()),
        )
    })
}

fn quantization_of(config: &Value) -> Option<Quantization> {
    let q = crate::layers::weights::quantization(config)?;
    Some(Quantization {
        bits: q.get("bits")?.as_i64()? as i32,
        group_size: q.get("group_size")?.as_i64()? as i32,
    })
}

pub(crate) fn to_mlx(d: WeightDtype) -> Dtype {
    match d {
        WeightDtype::Float32 => Dtype::Float32,
        WeightDtype::Float16 => Dtype::Float16,
        WeightDtype::Bfloat16 => Dtype::Bfloat16,
    }
}

fn from_mlx(d: Dtype) -> WeightDtype {
    match d {
        Dtype::Float16 => WeightDtype::Float16,
        Dtype::Bfloat16 => WeightDtype::Bfloat16,
        _ => WeightDtype::Float32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_width_is_the_language_models_where_only_it_says() {
        let flat = serde_json::json!({"vocab_size": 100, "text_config": {"vocab_size": 7}});
        assert_eq!(output_width(&flat), Some(100));
        let nested =
            serde_json::json!({"model_type": "mistral3", "text_config": {"vocab_size": 7}});
        assert_eq!(output_width(&nested), Some(7));
        assert_eq!(output_width(&serde_json::json!({})), None);
    }

    #[test]
    fn display_names_are_the_last_component() {
        for (model, name) in [
            (
                "HuggingFaceTB/SmolLM2-135M-Instruct",
                "SmolLM2-135M-Instruct",
            ),
            ("/models/gemma-3-270m/", "gemma-3-270m"),
            ("/cache/gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q4_k_m"),
            ("plain", "plain"),
        ] {
            assert_eq!(display_name(model), name);
        }
    }

    #[test]
    fn kv_bits_on_heads_that_cannot_take_them_give_a_reason() {
        assert_eq!(check_kv_bits(8, &[64, 128]).unwrap(), None);
        let reason = check_kv_bits(4, &[64, 16]).unwrap().unwrap();
        assert!(reason.contains("16 features"), "{reason}");
        assert!(check_kv_bits(3, &[64]).is_err());
    }
}
