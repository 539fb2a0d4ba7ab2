//! The engine as the worker holds it, with its resident models' tokenizers: `initialize`'s
//! facts, `load`, `unload`, `reset` and the `cache_*` calls from protocol params to protocol results and errors.
//! Generations reach the engine's scheduler directly ([`WorkerEngine::engine_mut`]). Lives on
//! the MLX thread (see `executor.rs`), like the [`Engine`] it owns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use mlx_engine::text::ModelTokenizer;
use mlx_engine::{BatchAttention, CancelToken, DiskSettings, Engine, Group};
use protocol::methods::{
    CacheEvictResult, CacheForkResult, CacheListResult, CachePinResult, GroupInfo, LoadParams,
    LoadResult, LoadStage, MlxInfo, ResetResult, UnloadParams, UnloadResult,
};
use protocol::ResponseError;

use crate::convert;
use crate::errors::engine_error;
use crate::executor::{to_value, CacheCall};
use crate::residents::Residents;

/// What `initialize` reports about the engine; fixed for the process's life.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// MLX version, backend and device.
    pub mlx: MlxInfo,
    /// `model_type`s the engine can load.
    pub architectures: Vec<String>,
    /// Image inputs supported.
    pub vision: bool,
    /// LoRA adapters supported.
    pub lora: bool,
    /// GGUF files supported.
    pub gguf: bool,
    /// The group of ranks this worker is rank 0 of, if any.
    pub group: Option<GroupInfo>,
    /// How batched generations attend.
    pub batch_attention: protocol::methods::BatchAttention,
    /// Whether stopping writes the prompt caches to disk (the disk tier is on).
    pub writes_at_exit: bool,
}

/// The engine and the tokenizers of its resident models.
pub struct WorkerEngine {
    engine: Engine,
    tokenizers: HashMap<String, Arc<ModelTokenizer>>,
}

/// The engine's settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Bytes of KV caches each model keeps for later prompts.
    pub prompt_cache_bytes: u64,
    /// MLX's memory limit; `None`: 85% of the device's memory.
    pub memory_limit: Option<u64>,
    /// How batched rows attend; `None`: the default.
    pub batch_attention: Option<BatchAttention>,
    /// The prompt cache's disk tier; `None`: off.
    pub disk_cache: Option<DiskSettings>,
}

impl WorkerEngine {
    /// Starts MLX with `settings`. In a `group`, every rank's engine gets the same calls
    /// (`group.rs`).
    pub fn new(settings: &Settings, group: Option<Group>) -> Self {
        let engine = Engine::new()
            .with_prompt_cache_bytes(settings.prompt_cache_bytes)
            .with_memory_limit(settings.memory_limit)
            .with_batch_attention(settings.batch_attention)
            .with_disk_cache(settings.disk_cache.clone());
        Self {
            engine: match group {
                Some(group) => engine.with_group(group),
                None => engine,
            },
            tokenizers: HashMap::new(),
        }
    }

    /// The group of ranks, if the worker runs as one.
    pub fn group(&self) -> Option<&Group> {
        self.engine.group()
    }

    /// What `initialize` reports.
    pub fn info(&self) -> EngineInfo {
        EngineInfo {
            mlx: convert::mlx_info(self.engine.device_info()),
            architectures: Engine::architectures()
                .iter()
                .map(|a| a.to_string())
                .collect(),
            vision: !Engine::vision_architectures().is_empty(),
            lora: true,
            gguf: true,
            group: self.engine.group_info().map(|g| convert::group_info(&g)),
            batch_attention: match self.engine.batch_attention() {
                BatchAttention::Rows => protocol::methods::BatchAttention::Rows,
                BatchAttention::Padded => protocol::methods::BatchAttention::Padded,
            },
            writes_at_exit: self.engine.cache_stats().disk.is_some(),
        }
    }

    /// `load`; `progress(stage, done, total, message)` reports as it goes.
    pub fn load(
        &mut self,
        params: &LoadParams,
        cancel: &CancelToken,
        progress: &mut dyn FnMut(LoadStage, u64, u64, String),
    ) -> Result<LoadResult, ResponseError> {
        let started = Instant::now();
        let request = convert::load_request(params)?;
        let mut report = |p: mlx_engine::LoadProgress| {
            progress(convert::load_stage(p.stage), p.done, p.total, p.message)
        };
        let loaded = self
            .engine
            .load(&request, &mut report, cancel)
            .map_err(engine_error)?;
        tracing::info!(
            model = %loaded.info.model_id,
            reused = loaded.reused,
            ms = started.elapsed().as_millis() as u64,
            "loaded"
        );
        self.tokenizers
            .insert(loaded.info.model_id.clone(), loaded.tokenizer);
        Ok(LoadResult {
            model_id: loaded.info.model_id.clone(),
            info: convert::model_info(&loaded.info),
            load_ms: started.elapsed().as_millis() as u64,
            memory: convert::memory(self.engine.memory()),
        })
    }

    /// The engine, for generations: they run as admissions to its scheduler
    /// (`generations.rs` on rank 0, [`Engine::generate`] on followers), not through here.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// `unload`: one model, or all.
    pub fn unload(&mut self, params: &UnloadParams) -> Result<UnloadResult, ResponseError> {
        let unloaded = self
            .engine
            .unload(params.model.as_deref())
            .map_err(engine_error)?;
        for id in &unloaded {
            self.tokenizers.remove(id);
        }
        Ok(UnloadResult {
            unloaded,
            memory: convert::memory(self.engine.memory()),
        })
    }

    /// `reset`: clears MLX's buffer cache, and the prompt caches when `prompt_cache`.
    pub fn reset(&mut self, prompt_cache: bool) -> ResetResult {
        self.engine.reset(prompt_cache);
        ResetResult {
            memory: convert::memory(self.engine.memory()),
        }
    }

    /// `cache_list`, `cache_pin`, `cache_fork`, `cache_evict`.
    pub fn cache(&mut self, call: CacheCall) -> Result<serde_json::Value, ResponseError> {
        let engine = &mut self.engine;
        let value = match call {
            CacheCall::List(p) => {
                let (model_id, list) = engine
                    .conversations(p.model.as_deref())
                    .map_err(engine_error)?;
                to_value(CacheListResult {
                    model_id,
                    conversations: list.into_iter().map(convert::kept_conversation).collect(),
                })
            }
            CacheCall::Pin(p) => {
                (engine.pin(p.model.as_deref(), &p.conversation_id, p.pinned))
                    .map_err(engine_error)?;
                to_value(CachePinResult { pinned: p.pinned })
            }
            CacheCall::Fork(p) => {
                let ids = (p.conversation_id.as_str(), p.new_conversation_id.as_str());
                let tokens = p.tokens.map(|t| t as usize);
                let held = (engine.fork(p.model.as_deref(), ids, tokens)).map_err(engine_error)?;
                to_value(CacheForkResult {
                    tokens: held as u64,
                })
            }
            CacheCall::Evict(p) => {
                let id = p.conversation_id.as_deref();
                let evicted = engine.evict(p.model.as_deref(), id).map_err(engine_error)?;
                to_value(CacheEvictResult {
                    evicted: evicted as u64,
                })
            }
        };
        Ok(value)
    }

    /// Resident models, their tokenizers and memory now.
    pub fn residents(&self) -> Residents {
        Residents {
            active_model: self.engine.active_model().map(str::to_owned),
            models: self
                .engine
                .models()
                .iter()
                .map(convert::resident_model)
                .collect(),
            memory: convert::memory(self.engine.memory()),
            prompt_cache: convert::prompt_cache(self.engine.cache_stats()),
            tokenizers: self.tokenizers.clone(),
            finished: Vec::new(),
        }
    }

    /// Frees every model and MLX's cache before the process exits.
    pub fn free(&mut self) {
        if let Err(e) = self.engine.unload(None) {
            tracing::warn!("freeing the models failed: {e}");
        }
        self.tokenizers.clear();
    }
}
