//! The engine: resident models, and the calls the worker makes on its MLX thread.

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::Arc,
    time::Instant,
};

use text::ModelTokenizer;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::device,
    layers::distributed::Group,
    layers::parallel::Placement,
    models::{self, LanguageModel},
    runtime::disk_cache::{self, DiskSettings, DiskShared, DiskTier},
    runtime::footprint,
    runtime::generate::{PREFILL_CHUNK_CPU, PREFILL_CHUNK_GPU},
    runtime::load,
    runtime::memory,
    runtime::prompt,
    runtime::prompt_cache::{self as prompt_cache, PromptCache, DEFAULT_PROMPT_CACHE_BYTES},
    runtime::request::*,
    runtime::resident::{Draft, Resident},
    runtime::scheduler::BatchAttention,
    runtime::scheduler::{self, Admission, More, Setting},
    vision::{self},
    CancelToken,
};

/// Resident models and MLX state. Lives on one thread; see the crate docs.
pub struct Engine {
    /// In load order; the last one is the active model.
    pub(crate) models: Vec<Resident>,
    device: DeviceInfo,
    /// The byte budget of the active model's prompt cache.
    prompt_cache_bytes: u64,
    /// The group of ranks this engine runs in step with, if the worker runs as one.
    pub(crate) group: Option<Rc<Group>>,
    /// How batched rows attend; `None`: the default.
    batch_attention: Option<BatchAttention>,
    /// MLX's memory limit as the host set it; `None`: 85% of the device's memory.
    memory_limit: Option<u64>,
    /// The prompt cache's disk tier, if on.
    disk: Option<Rc<RefCell<DiskShared>>>,
    /// What the residents' prompt caches have served.
    cache_counts: Rc<Cell<prompt_cache::Counts>>,
}

/// What a successful `load` gives back.
pub struct Loaded {
    pub info: ModelInfo,
    /// The model's tokenizer and chat template, for `tokenize` on other threads.
    pub tokenizer: Arc<ModelTokenizer>,
    /// Whether the model was already resident and kept (no `force`).
    pub reused: bool,
}

/// What this rank holds of a model: its layers and the bytes of its weights.
fn rank_share(model: &mut dyn LanguageModel) -> serde_json::Value {
    let layers = match model.stage() {
        Some(stage) => stage.layers,
        None => 0..model.facts().layers,
    };
    let weight_bytes = load::linear_bytes(model);
    serde_json::json!({ "layers": [layers.start, layers.end], "weight_bytes": weight_bytes })
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.models.clear();
        let _ = device::synchronize();
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
            prompt_cache_bytes: DEFAULT_PROMPT_CACHE_BYTES,
            group: None,
            batch_attention: None,
            memory_limit: None,
            disk: None,
            cache_counts: Rc::default(),
        }
    }

    /// Conversations' caches that leave memory go to a disk tier (`None`: they are dropped);
    /// see [`disk_cache`](crate::runtime::disk_cache). Not in a group of ranks.
    pub fn with_disk_cache(mut self, settings: Option<DiskSettings>) -> Self {
        self.disk = settings
            .filter(|_| self.group.is_none())
            .map(DiskShared::new);
        self
    }

    /// Holds MLX's memory to `bytes` (`None`: 85% of the device's memory): what `load` fits
    /// contexts to and `generate` admits requests within.
    pub fn with_memory_limit(mut self, bytes: Option<u64>) -> Self {
        self.memory_limit = bytes;
        memory::apply_limits(&self.device, bytes);
        self
    }

    /// Batched rows attend as `attention` says; `None`: the default ([`BatchAttention`]).
    pub fn with_batch_attention(mut self, attention: Option<BatchAttention>) -> Self {
        self.batch_attention = attention;
        self
    }

    /// How batched rows attend.
    pub fn batch_attention(&self) -> BatchAttention {
        self.batch_attention.unwrap_or_default()
    }

    /// Runs in step with the other ranks of `group`: every rank gets the same calls in the same
    /// order (the worker's rank 0 shares them), and models may be split over them.
    ///
    /// The prompt cache then keeps the newest conversation only: which older ones fit a byte
    /// budget depends on the bytes each rank holds (a pipeline's stages differ), and a prefix
    /// reused on one rank but not another would put the ranks out of step.
    pub fn with_group(mut self, group: Group) -> Self {
        if self.prompt_cache_bytes > 0 {
            tracing::info!("in a group of ranks the prompt cache keeps the newest conversation");
        }
        self.prompt_cache_bytes = 0;
        self.disk = None;
        self.group = Some(Rc::new(group));
        self
    }

    /// The group, if the engine runs in one.
    pub fn group(&self) -> Option<&Group> {
        self.group.as_deref()
    }

    /// The group as `initialize` describes it.
    pub fn group_info(&self) -> Option<GroupInfo> {
        self.group.as_ref().map(|g| GroupInfo {
            backend: g.backend().name().to_owned(),
            size: g.size(),
            rank: g.rank(),
        })
    }

    /// Bounds the bytes of KV caches the active model keeps for later prompts.
    pub fn with_prompt_cache_bytes(mut self, bytes: u64) -> Self {
        self.prompt_cache_bytes = bytes;
        self
    }

    /// The device MLX computes on.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.device
    }

    /// The `model_type`s this build runs: text models, then vision-language models.
    pub fn architectures() -> Vec<&'static str> {
        let all = models::ARCHITECTURES.iter().chain(vision::ARCHITECTURES);
        all.copied().collect()
    }

    /// The `model_type`s of vision-language models this build runs (images in).
    pub fn vision_architectures() -> &'static [&'static str] {
        vision::ARCHITECTURES
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

    /// Makes a model resident (and active): the steps of `load.rs`. A failure leaves resident
    /// models as they were.
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
        let placement = self.placement(req)?;
        let built = self.build(req, placement, progress, cancel);
        let nothing_resident = self.models.is_empty();
        // A failed load gives back what it took: its arrays are gone, MLX's cache of their
        // buffers goes too.
        let resident = self
            .agree(built)
            .inspect_err(|_| memory::release(nothing_resident))?;
        let (info, tokenizer) = (resident.info.clone(), resident.tokenizer.clone());
        self.models.retain(|r| r.info.model_id != model_id);
        self.models.push(resident);
        load::report(progress, LoadStage::Ready, 1, "");
        Ok(Loaded {
            info,
            tokenizer,
            reused: false,
        })
    }

    /// How `req` splits the model over the group, if it asks to.
    fn placement(&self, req: &LoadRequest) -> Result<Option<Placement>, EngineError> {
        let Some(mode) = req.parallel else {
            return Ok(None);
        };
        let Some(group) = &self.group else {
            return Err(load::refuse_parallel(
                "this worker runs alone: start it as a group of ranks (`mlx.launch`, `cargo \
                 xtask launch`) to split a model over them",
            ));
        };
        Ok(Some(Placement {
            group: group.clone(),
            mode,
            dtypes: Default::default(),
        }))
    }

    /// This rank's resident for `req`, not yet in `models`: the steps of `load.rs`.
    fn build(
        &self,
        req: &LoadRequest,
        placement: Option<Placement>,
        progress: &mut dyn FnMut(LoadProgress),
        cancel: &CancelToken,
    ) -> Result<Resident, EngineError> {
        let files = load::resolve(req, progress, cancel)?;
        let (config, tokenizer) = load::read(&files, req, progress, cancel)?;
        memory::apply_limits(&self.device, self.memory_limit);
        let held = self.held_beside(&req.model);
        let mut built = load::build(&files, &config, req, placement, progress)?;
        let adapter_switch = load::quantize(&mut built, &files, req, progress)?;
        load::check_experts_run_on(built.model.as_mut(), self.device.backend)?;
        let (draft, draft_bytes) = load::draft(req, &tokenizer, &built, progress, cancel)?.unzip();
        let mut info = load::describe(req, &files, &config, &tokenizer, &built);
        info.draft_kind = draft.as_ref().map(Draft::kind);
        info.speculative_auto =
            load::auto_drafter(built.model.as_ref(), draft.as_ref(), info.kv_bits);
        let draft_model = match &draft {
            Some(Draft::Model(m)) => Some(m.as_ref()),
            _ => None,
        };
        let pricing = footprint::Pricing {
            config: &config,
            weights: built.weight_bytes + draft_bytes.unwrap_or(0),
            kv_bits: info.kv_bits,
            chunk: self.prefill_chunk(),
            backend: self.device.backend,
            dtype: load::to_mlx(built.dtype),
            in_group: self.group.is_some(),
        };
        let footprint = footprint::price(built.model.as_ref(), draft_model, pricing)?;
        // Beside the weights, what other residents do not hold. Kept conversations' caches
        // do not count: a generation that needs their memory has them dropped (`admit`).
        let available =
            memory::limit_bytes().map(|limit| limit.saturating_sub(held + footprint.weights));
        let pinned = req.max_seq_length > 0;
        let (context, plan) = footprint.fit(info.context_length as u64, pinned, available);
        (info.context_length, info.memory) = (context as usize, plan);
        Ok(Resident {
            info,
            model: built.model,
            vision: built.vision,
            tokenizer: Arc::new(tokenizer),
            load: LoadRequest {
                hf_token: None,
                force: false,
                ..req.clone()
            },
            adapter: adapter_switch,
            draft,
            footprint,
            prompt_cache: PromptCache::new(self.prompt_cache_bytes)
                .with_tiers(self.disk_tier(&files, req), self.cache_counts.clone()),
            image_features: Default::default(),
            vocabulary: None,
        })
    }

    /// A resident's part of the disk tier, keyed by what decides its caches' numbers.
    fn disk_tier(&self, files: &load::Files, req: &LoadRequest) -> Option<DiskTier> {
        let shared = self.disk.as_ref()?;
        let paths: Vec<&std::path::Path> = std::iter::once(files.path.as_path())
            .chain(files.adapter.as_deref())
            .collect();
        let options = format!("{}|{:?}|{:?}", req.load_in_4bit, req.dtype, req.kv_bits);
        let key = disk_cache::model_key(&paths, &options, &self.device);
        Some(DiskTier::new(shared.clone(), key))
    }

    /// What the prompt cache's tiers hold and have served since the engine started.
    pub fn cache_stats(&self) -> CacheStats {
        let counts = self.cache_counts.get();
        let entries = self
            .models
            .iter()
            .map(|r| r.prompt_cache.len() as u64)
            .sum();
        let bytes = self.models.iter().map(|r| r.prompt_cache.bytes()).sum();
        CacheStats {
            lookups: counts.lookups,
            memory: TierStats {
                entries,
                bytes,
                hits: counts.hits,
                hit_tokens: counts.hit_tokens,
            },
            disk: self.disk.as_ref().map(|d| {
                let d = d.borrow();
                let (files, bytes) = disk_cache::usage(&d.settings.dir);
                DiskStats {
                    tier: TierStats {
                        entries: files,
                        bytes,
                        hits: d.counts.hits,
                        hit_tokens: d.counts.hit_tokens,
                    },
                    budget_bytes: d.settings.bytes,
                    counts: d.counts,
                }
            }),
        }
    }

    /// The kept conversations of `model` (`None`: the active one), in memory and on disk,
    /// with the model's id.
    pub fn conversations(
        &mut self,
        model: Option<&str>,
    ) -> Result<(String, Vec<Conversation>), EngineError> {
        let i = self.position(model)?;
        let r = &mut self.models[i];
        Ok((r.info.model_id.clone(), r.prompt_cache.list()))
    }

    /// Pins (or unpins) a kept conversation of `model`: kept in memory past the budget.
    pub fn pin(&mut self, model: Option<&str>, id: &str, pinned: bool) -> Result<(), EngineError> {
        let i = self.position(model)?;
        let r = &mut self.models[i];
        let make = || r.model.make_caches();
        (r.prompt_cache.pin(id, pinned, &make)).map_err(EngineError::Conversation)
    }

    /// Starts conversation `new` from the first `tokens` (default all) of conversation `id`,
    /// sharing its caches. Returns the tokens the new one holds.
    pub fn fork(
        &mut self,
        model: Option<&str>,
        (id, new): (&str, &str),
        tokens: Option<usize>,
    ) -> Result<usize, EngineError> {
        let i = self.position(model)?;
        let r = &mut self.models[i];
        let make = || r.model.make_caches();
        (r.prompt_cache.fork((id, new), tokens, &make)).map_err(EngineError::Conversation)
    }

    /// Forgets conversation `id` of `model` (every one with `None`), in memory and on disk.
    /// Returns how many entries and files went.
    pub fn evict(&mut self, model: Option<&str>, id: Option<&str>) -> Result<usize, EngineError> {
        let i = self.position(model)?;
        Ok(self.models[i].prompt_cache.evict(id))
    }

    /// What MLX holds for the other residents, as a load of `model_id` prices against it: not
    /// their kept conversations and image features (a generation that needs the memory has
    /// them dropped), nor a resident of that id (the load replaces it).
    fn held_beside(&self, model_id: &str) -> u64 {
        let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
        let freed: u64 = (self.models.iter())
            .map(|r| match r.info.model_id == model_id {
                true => r.footprint.weights + r.cached_bytes(),
                false => r.cached_bytes(),
            })
            .sum();
        active.saturating_sub(freed)
    }

    /// In a group, every rank's load must succeed or none keeps it: the ranks tell each other
    /// how theirs went (and what each holds of a split model) before any makes it resident.
    fn agree(&self, local: Result<Resident, EngineError>) -> Result<Resident, EngineError> {
        let Some(group) = &self.group else {
            return local;
        };
        let mut local = local;
        let share = match &mut local {
            Ok(r) => rank_share(r.model.as_mut()),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        let shares = group
            .gather_bytes(share.to_string().as_bytes())
            .map_err(|e| load::refuse_parallel(format!("the ranks could not agree: {e}")))?;
        let shares: Vec<serde_json::Value> = shares
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap_or_default())
            .collect();
        let mut resident = local?;
        if let Some((rank, error)) = shares
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((i, s.get("error")?.as_str()?)))
        {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!("rank {rank} of the group could not load the model: {error}"),
            ));
        }
        if let Some(mode) = resident.load.parallel {
            let ranks = shares.iter().map(|s| RankShare {
                layers: (
                    s["layers"][0].as_u64().unwrap_or(0) as usize,
                    s["layers"][1].as_u64().unwrap_or(0) as usize,
                ),
                weight_bytes: s["weight_bytes"].as_u64().unwrap_or(0),
            });
            resident.info.parallel = Some(ParallelInfo {
                mode,
                ranks: ranks.collect(),
            });
        }
        Ok(resident)
    }

    /// Generates a completion with a resident model: an admission to the scheduler, as a batch
    /// of one.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_delta: &mut dyn FnMut(Delta),
        cancel: &CancelToken,
    ) -> Result<Completion, EngineError> {
        let result = std::cell::RefCell::new(None);
        let first = Admission {
            req: req.clone(),
            cancel: cancel.clone(),
            on_delta: Box::new(on_delta),
            on_done: Box::new(|r| *result.borrow_mut() = Some(r)),
        };
        self.generate_batch(first, 1, &mut |_| None);
        (result.into_inner()).unwrap_or_else(|| {
            Err(EngineError::Generation(
                "the scheduler gave no answer".into(),
            ))
        })
    }

    /// Runs `first`, and with it, joining between its decode steps, each generation `more`
    /// hands over, at most `max_batch` at a time (`scheduler.rs`). `more` is asked between
    /// steps with a test of what can join (the same resident, the same adapter state, not
    /// speculative, a model whose steps can be batched, no group of ranks); it gives the next
    /// request only if that passes (else `None`, and is asked again next step). Returns when
    /// nothing runs and nothing joined. Every admission's `on_done` is called once.
    pub fn generate_batch<'f>(
        &mut self,
        first: Admission<'f>,
        max_batch: usize,
        more: &mut More<'f>,
    ) {
        let started = Instant::now();
        let i = match self.using(first.req.model.as_deref()) {
            Ok(i) => i,
            Err(e) => return (first.on_done)(Err(e)),
        };
        let on = Setting {
            prefill_chunk: self.prefill_chunk(),
            attention: self.batch_attention(),
            active: i + 1 == self.models.len(),
            group: self.group.as_deref(),
            max_batch,
        };
        let (view, cache, vocabulary) = self.models[i].split();
        scheduler::run(on, view, cache, vocabulary, (first, started), more);
    }

    /// The index of the resident `model` names, now the only one with a prompt cache: memory
    /// for one, not one per resident (the others' conversations go to the disk tier, if on).
    pub(crate) fn using(&mut self, model: Option<&str>) -> Result<usize, EngineError> {
        let i = self.position(model)?;
        for (j, other) in self.models.iter_mut().enumerate() {
            if j != i {
                other.prompt_cache.spill_all();
                other.forget_caches();
            }
        }
        Ok(i)
    }

    /// Prompt tokens per prefill forward pass on this device.
    pub(crate) fn prefill_chunk(&self) -> usize {
        match self.device.backend {
            Backend::Cpu => PREFILL_CHUNK_CPU,
            Backend::Cuda | Backend::Metal => PREFILL_CHUNK_GPU,
        }
    }

    /// The token ids a resident model would generate from for `prompt`: its chat template,
    /// images decoded and their placeholders expanded for a vision model.
    pub fn prompt_ids(
        &self,
        model: Option<&str>,
        prompt: &Prompt,
    ) -> Result<Vec<u32>, EngineError> {
        let r = self.find(model)?;
        Ok(prompt::prompt_inputs(&r.tokenizer, r.vision.as_deref(), prompt)?.ids)
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

    /// Clears MLX's buffer cache and, when `prompt_cache`, every resident's prompt cache.
    pub fn reset(&mut self, prompt_cache: bool) {
        if prompt_cache {
            for r in &mut self.models {
                r.forget_caches();
            }
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

#[cfg(test)]
impl Engine {
    /// An engine holding a tiny random Llama (`fixtures::TinyLlama::default()`), written to a
    /// temporary directory named for `name` and this process; the caller removes the directory.
    pub(crate) fn with_tiny_llama(name: &str) -> (Self, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("mlx-{name}-{}", std::process::id()));
        fixtures::write_tiny_llama(&dir, &fixtures::TinyLlama::default()).unwrap();
        let mut engine = Engine::new();
        let req = LoadRequest {
            model: dir.display().to_string(),
            ..Default::default()
        };
        engine.load(&req, &mut |_| {}, &CancelToken::new()).unwrap();
        (engine, dir)
    }
}

#[cfg(test)]
mod tests {
    use super::Engine;

    /// The README's list of model types is the engine's, which `initialize` reports as
    /// `capabilities.architectures` (and `cargo xtask families` sets beside mlx-lm's).
    #[test]
    fn the_readme_lists_the_model_types_this_build_runs() {
        let readme = include_str!("../../../../README.md");
        let lead = "Model types this build runs (";
        let paragraph: String = readme
            .split("\n\n")
            .find(|p| p.starts_with(lead))
            .expect("README.md has a paragraph starting `Model types this build runs (`")
            .replace('\n', " ");
        let (_, list) = paragraph.split_once("): ").expect("`): ` before the list");
        let mut listed: Vec<&str> = list.trim_end_matches('.').split(", ").collect();
        listed.sort_unstable();
        let mut runs = Engine::architectures();
        runs.sort_unstable();
        assert_eq!(
            listed,
            runs,
            "README.md's list is not the engine's; write: {}",
            runs.join(", ")
        );
    }
}
