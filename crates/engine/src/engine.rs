//! The engine: resident models, and the calls the worker makes on its MLX thread.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use mlx_rs::Dtype;
use serde_json::Value;
use text::ModelTokenizer;

use crate::{
    device,
    error::{EngineError, LoadErrorKind},
    generate::{generate, GenerationContext, PREFILL_CHUNK_CPU, PREFILL_CHUNK_GPU},
    kv_cache::KV_GROUP_SIZE,
    lora::{self, Adapter, AdapterSwitch},
    memory,
    models::{self, LanguageModel},
    prompt_cache::PromptCache,
    request::*,
    weights::Weights,
    CancelToken,
};

/// A model made resident by `load`.
struct Resident {
    info: ModelInfo,
    model: Box<dyn LanguageModel>,
    tokenizer: Arc<ModelTokenizer>,
    /// The load that made it (without the token): which options it runs with.
    load: LoadRequest,
    /// The switch of the attached adapter, if any.
    adapter: Option<AdapterSwitch>,
    /// The last generation's KV caches, for the next prompt that starts the same way.
    prompt_cache: PromptCache,
}

/// Resident models and MLX state. Lives on one thread; see the crate docs.
pub struct Engine {
    /// In load order; the last one is the active model.
    models: Vec<Resident>,
    device: DeviceInfo,
}

/// What a successful `load` gives back.
pub struct Loaded {
    pub info: ModelInfo,
    /// The model's tokenizer and chat template, for `tokenize` on other threads.
    pub tokenizer: Arc<ModelTokenizer>,
    /// Whether the model was already resident and kept (no `force`).
    pub reused: bool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.models.clear();
        device::synchronize();
        memory::release(true);
    }
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// Starts MLX on its default device.
    pub fn new() -> Self {
        let device = device::device_info();
        tracing::info!(
            mlx = %device.mlx_version, backend = ?device.backend, device = %device.name,
            memory_bytes = device.memory_bytes, blas = %device.cpu_blas, "MLX ready"
        );
        Self {
            models: Vec::new(),
            device,
        }
    }

    /// The device MLX computes on.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.device
    }

    /// The `model_type`s this build runs.
    pub fn architectures() -> &'static [&'static str] {
        models::ARCHITECTURES
    }

    /// MLX memory now.
    pub fn memory(&self) -> MemoryStats {
        memory::stats()
    }

    /// Infos of resident models, in load order (the last is active).
    pub fn models(&self) -> Vec<ModelInfo> {
        self.models.iter().map(|r| r.info.clone()).collect()
    }

    /// The active model's id.
    pub fn active_model(&self) -> Option<&str> {
        self.models.last().map(|r| r.info.model_id.as_str())
    }

    /// Makes a model resident (and active). A failure leaves resident models as they were.
    pub fn load(
        &mut self,
        req: &LoadRequest,
        progress: &mut dyn FnMut(LoadProgress),
        cancel: &CancelToken,
    ) -> Result<Loaded, EngineError> {
        let model_id = req.model.clone();
        if let Some(i) = self.models.iter().position(|r| r.info.model_id == model_id) {
            if !req.force && self.models[i].load.same_model_as(req) {
                let r = self.models.remove(i);
                let loaded = Loaded {
                    info: r.info.clone(),
                    tokenizer: r.tokenizer.clone(),
                    reused: true,
                };
                self.models.push(r);
                return Ok(loaded);
            }
        }
        let is_gguf = req.model.ends_with(".gguf") && Path::new(&req.model).is_file();
        let path = if is_gguf {
            progress(LoadProgress {
                stage: LoadStage::Weights,
                done: 0,
                total: 1,
                message: "importing GGUF".into(),
            });
            model_store::gguf_import::imported_dir(Path::new(&req.model))?
        } else {
            resolve(&req.model, req, progress, cancel)?
        };
        // An adapter: asked for, or the `model` directory is one (then its base is the model).
        let (path, adapter_dir) = match &req.adapter {
            Some(adapter) => (path, Some(resolve(adapter, req, progress, cancel)?)),
            None if lora::is_adapter_dir(&path) => {
                let base = lora::base_model_of(&path)?;
                (resolve(&base, req, progress, cancel)?, Some(path))
            }
            None => (path, None),
        };
        progress(LoadProgress {
            stage: LoadStage::Resolve,
            done: 1,
            total: 1,
            message: path.display().to_string(),
        });
        let config = read_config(&path)?;

        progress(LoadProgress {
            stage: LoadStage::Tokenizer,
            done: 0,
            total: 1,
            message: String::new(),
        });
        let mut tokenizer = ModelTokenizer::from_dir(&path).map_err(|e| {
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

        progress(LoadProgress {
            stage: LoadStage::Weights,
            done: 0,
            total: 1,
            message: String::new(),
        });
        memory::apply_limits(&self.device);
        let mut weights = Weights::load_dir(&path, &config)?;
        if let Some(dtype) = req.dtype {
            weights.cast_floats(to_mlx(dtype))?;
        }
        let dtype = weights
            .float_dtype()
            .map(from_mlx)
            .unwrap_or(WeightDtype::Float32);
        let num_parameters = weights.num_parameters();
        let mut model = models::build(&config, weights)?;
        let mut quantization = quantization_of(&config);
        if req.load_in_4bit && quantization.is_none() {
            for (_, linear) in model.linears_mut() {
                if linear.weight.dim(-1) % 64 == 0 {
                    linear.quantize(64, 4)?;
                }
            }
            quantization = Some(Quantization {
                bits: 4,
                group_size: 64,
            });
        }
        if let Some(bits) = req.kv_bits {
            check_kv_bits(bits, &model.quantizable_kv_head_dims())?;
        }
        let adapter_switch = match &adapter_dir {
            Some(dir) => Some(Adapter::load(dir)?.attach(dir, model.linears_mut())?),
            None => None,
        };
        let arrays: Vec<_> = model
            .linears_mut()
            .into_iter()
            .map(|(_, l)| l.weight.clone())
            .collect();
        mlx_rs::transforms::eval(arrays.iter()).map_err(|e| {
            EngineError::load(
                LoadErrorKind::OutOfMemory,
                format!("materialising weights: {e}"),
            )
        })?;
        progress(LoadProgress {
            stage: LoadStage::Weights,
            done: 1,
            total: 1,
            message: String::new(),
        });

        let own_context = model.max_position_embeddings().unwrap_or(4096);
        let context_length = if req.max_seq_length > 0 {
            req.max_seq_length
        } else {
            own_context
        };
        let info = ModelInfo {
            model_id: model_id.clone(),
            path: path.clone(),
            architecture: config["model_type"].as_str().unwrap_or_default().to_owned(),
            model_type: config["model_type"].as_str().unwrap_or_default().to_owned(),
            is_vision: false,
            is_lora: adapter_dir.is_some(),
            is_gguf,
            dtype,
            quantization,
            context_length,
            num_parameters,
            // The model's output width (embeddings are often padded past the tokenizer's size):
            // what the sampler's logit-bias row and token checks must match.
            vocab_size: config["vocab_size"]
                .as_u64()
                .map_or_else(|| tokenizer.vocab_size(), |v| v as usize),
            eos_token_ids: tokenizer.eos_token_ids().iter().copied().collect(),
            chat_template_present: tokenizer.chat_template().is_some(),
            chat_template_source: match tokenizer.chat_template_source() {
                // The importer carried the GGUF's own template into tokenizer_config.json.
                text::ChatTemplateSource::TokenizerConfig if is_gguf => {
                    text::ChatTemplateSource::Gguf
                }
                source => source,
            },
        };
        let tokenizer = Arc::new(tokenizer);
        self.models.retain(|r| r.info.model_id != model_id);
        self.models.push(Resident {
            info: info.clone(),
            model,
            tokenizer: tokenizer.clone(),
            load: LoadRequest {
                hf_token: None,
                force: false,
                ..req.clone()
            },
            adapter: adapter_switch,
            prompt_cache: PromptCache::default(),
        });
        progress(LoadProgress {
            stage: LoadStage::Ready,
            done: 1,
            total: 1,
            message: String::new(),
        });
        Ok(Loaded {
            info,
            tokenizer,
            reused: false,
        })
    }

    /// Generates a completion with a resident model.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_delta: &mut dyn FnMut(Delta),
        cancel: &CancelToken,
    ) -> Result<Completion, EngineError> {
        let started = Instant::now();
        let i = self.position(req.model.as_deref())?;
        // Only the model in use keeps a prompt cache: memory for one, not one per resident.
        for (j, other) in self.models.iter_mut().enumerate() {
            if j != i {
                other.prompt_cache.clear();
            }
        }
        let resident = &mut self.models[i];
        let prompt_ids = prompt_ids(&resident.tokenizer, &req.prompt)?;
        let context = resident.info.context_length;
        if prompt_ids.len() > context {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: prompt_ids.len(),
                context_length: context,
            });
        }
        let mut req = req.clone();
        req.max_new_tokens = req.max_new_tokens.min(context - prompt_ids.len());
        let adapter_on = resident.adapter.is_some() && req.use_adapter != Some(false);
        if let Some(switch) = &resident.adapter {
            switch.set(adapter_on);
        }
        let eos = resident.tokenizer.eos_token_ids().clone();
        let ctx = GenerationContext {
            model: resident.model.as_ref(),
            tokenizer: &resident.tokenizer,
            eos: &eos,
            vocab_size: resident.info.vocab_size.max(1),
            kv_bits: resident.load.kv_bits.map(i32::from),
            adapter_on,
            prefill_chunk: match self.device.backend {
                Backend::Cpu => PREFILL_CHUNK_CPU,
                Backend::Cuda | Backend::Metal => PREFILL_CHUNK_GPU,
            },
        };
        let cache = &mut resident.prompt_cache;
        let result = generate(&ctx, &req, &prompt_ids, cache, on_delta, cancel, started);
        if result.is_err() {
            // An MLX error mid-graph can leave work and buffers behind; start the next clean.
            device::synchronize();
            let _ = mlx_rs::memory::clear_cache();
        }
        result
    }

    /// Unloads one model, or all (`None`). Returns the ids unloaded.
    pub fn unload(&mut self, model: Option<&str>) -> Result<Vec<String>, EngineError> {
        let ids: Vec<String> = match model {
            Some(id) => {
                self.find(Some(id))?;
                vec![id.to_owned()]
            }
            None => self
                .models
                .iter()
                .map(|r| r.info.model_id.clone())
                .collect(),
        };
        self.models.retain(|r| !ids.contains(&r.info.model_id));
        memory::release(self.models.is_empty());
        Ok(ids)
    }

    /// Clears MLX's buffer cache and every resident's prompt cache.
    pub fn reset(&mut self) {
        for r in &mut self.models {
            r.prompt_cache.clear();
        }
        memory::release(false);
    }

    fn find(&self, model: Option<&str>) -> Result<&Resident, EngineError> {
        Ok(&self.models[self.position(model)?])
    }

    /// The index of `model` (`None`: the active one) among the residents.
    fn position(&self, model: Option<&str>) -> Result<usize, EngineError> {
        let found = match model {
            None => self.models.len().checked_sub(1),
            Some(id) => self.models.iter().position(|r| r.info.model_id == id),
        };
        found.ok_or_else(|| match model {
            None => EngineError::NotResident("no model is loaded: call `load` first".into()),
            Some(id) => EngineError::NotResident(format!(
                "model `{id}` is not resident; resident: [{}]",
                self.models
                    .iter()
                    .map(|r| r.info.model_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        })
    }
}

/// Token ids of a prompt with this model's tokenizer and chat template.
pub fn prompt_ids(tokenizer: &ModelTokenizer, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
    match prompt {
        Prompt::Tokens(ids) => Ok(ids.clone()),
        Prompt::Text(text) => tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::Template(e.to_string())),
        Prompt::Chat { messages, options } => tokenizer
            .render_and_encode(messages, options)
            .map(|r| r.ids)
            .map_err(|e| EngineError::Template(e.to_string())),
    }
}

/// A local directory, or a hub repo id's snapshot (`model_store`). `model` is `req.model`, or an
/// adapter or base model named beside it (fetched at its default revision, with the same token).
fn resolve(
    model: &str,
    req: &LoadRequest,
    progress: &mut dyn FnMut(LoadProgress),
    cancel: &CancelToken,
) -> Result<PathBuf, EngineError> {
    let source = model_store::Source {
        model,
        revision: if model == req.model { req.revision.as_deref() } else { None },
        hf_token: req.hf_token.as_ref(),
    };
    Ok(model_store::resolve(&source, progress, &|| cancel.is_cancelled())?)
}

/// `kv_bits` quantizes each cached head in groups of [`KV_GROUP_SIZE`] features.
fn check_kv_bits(bits: u8, head_dims: &[i32]) -> Result<(), EngineError> {
    let invalid = |reason: String| EngineError::InvalidParams {
        field: "kv_bits".into(),
        reason,
    };
    if ![4, 8].contains(&bits) {
        return Err(invalid(format!("must be 4 or 8, not {bits}")));
    }
    match head_dims.iter().find(|d| *d % KV_GROUP_SIZE != 0) {
        Some(d) => Err(invalid(format!(
            "this model's attention heads have {d} features, not a multiple of {KV_GROUP_SIZE}, \
             so its KV cache cannot be quantized; load it without kv_bits"
        ))),
        None => Ok(()),
    }
}

fn read_config(dir: &Path) -> Result<Value, EngineError> {
    let file = dir.join("config.json");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        EngineError::load(LoadErrorKind::NotFound, format!("{}: {e}", file.display()))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("{}: {e}", file.display()),
        )
    })
}

fn quantization_of(config: &Value) -> Option<Quantization> {
    let q = config.get("quantization")?;
    Some(Quantization {
        bits: q.get("bits")?.as_i64()? as i32,
        group_size: q.get("group_size")?.as_i64()? as i32,
    })
}

fn to_mlx(d: WeightDtype) -> Dtype {
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
