//! A scripted backend for the end-to-end tests (feature `fake-engine`): no MLX, no model.
//!
//! `load` accepts any model name except those starting with `missing/` (`-32002 not_found`).
//! `generate` emits `max_new_tokens` deltas `"tN "`, one every `MLX_WORKER_FAKE_STEP_MS`
//! milliseconds (default 20), polling the cancel flag between steps like the engine does.
//! `tokenize` returns the text's bytes.

use std::sync::Arc;
use std::time::Duration;

use protocol::methods::{
    ChatTemplateInfo, ChatTemplateSource, Dtype, FinishReason, GenerateParams, GenerateResult,
    LoadParams, LoadResult, LoadStage, MemoryInfo, MlxInfo, ModelInfo, ResetResult, ResidentModel,
    Timings, TokenLogprob, TokenizeParams, TokenizeResult, UnloadParams, UnloadResult, Usage,
};
use protocol::{LoadErrorKind, ResponseError};

use crate::backend::{Backend, BackendInfo, CancelFlag, CancelSignal, Residents, TokenizeService};

/// The scripted backend.
#[derive(Debug, Default)]
pub struct FakeBackend {
    models: Vec<String>,
}

struct ByteTokenizer;

impl TokenizeService for ByteTokenizer {
    fn tokenize(&self, params: &TokenizeParams) -> Result<TokenizeResult, ResponseError> {
        let text = params.text.clone().unwrap_or_default();
        let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        Ok(TokenizeResult {
            count: tokens.len(),
            tokens,
            prompt: None,
        })
    }
}

fn info(model: &str) -> ModelInfo {
    ModelInfo {
        architecture: "FakeForCausalLM".into(),
        model_type: model.into(),
        is_vision: false,
        is_lora: false,
        is_gguf: false,
        dtype: Dtype::Float32,
        quantization: None,
        context_length: 4096,
        num_parameters: 0,
        vocab_size: 256,
        eos_token_ids: vec![0],
        chat_template: ChatTemplateInfo {
            present: false,
            source: ChatTemplateSource::None,
        },
    }
}

impl Backend for FakeBackend {
    type Cancel = CancelFlag;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            mlx: MlxInfo {
                version: "fake".into(),
                backend: protocol::methods::Backend::Cpu,
                device: protocol::methods::DeviceInfo {
                    name: "fake".into(),
                    memory_bytes: 0,
                    recommended_working_set_bytes: None,
                },
            },
            architectures: vec!["fake".into()],
            vision: false,
            lora: false,
            gguf: false,
        }
    }

    fn tokenizer(&self) -> Arc<dyn TokenizeService> {
        Arc::new(ByteTokenizer)
    }

    fn load(
        &mut self,
        params: &LoadParams,
        _: &CancelFlag,
        progress: &mut dyn FnMut(LoadStage, u64, u64, String),
    ) -> Result<LoadResult, ResponseError> {
        if params.model.starts_with("missing/") {
            return Err(ResponseError::load_failed(
                LoadErrorKind::NotFound,
                format!("no model `{}`", params.model),
            ));
        }
        progress(LoadStage::Resolve, 0, 1, String::new());
        progress(LoadStage::Ready, 1, 1, String::new());
        self.models.retain(|m| m != &params.model);
        self.models.push(params.model.clone());
        Ok(LoadResult {
            model_id: params.model.clone(),
            info: info(&params.model),
            load_ms: 0,
            memory: MemoryInfo::default(),
        })
    }

    fn generate(
        &mut self,
        params: &GenerateParams,
        cancel: &CancelFlag,
        on_delta: &mut dyn FnMut(String, Option<Vec<TokenLogprob>>),
    ) -> Result<GenerateResult, ResponseError> {
        let model = params.model.as_ref().or(self.models.last());
        match model {
            Some(m) if self.models.contains(m) => {}
            _ => return Err(ResponseError::no_model(params.model.as_deref())),
        }
        let step = std::env::var("MLX_WORKER_FAKE_STEP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        let mut text = String::new();
        let mut finish_reason = FinishReason::Length;
        for n in 0..params.max_new_tokens {
            if cancel.is_cancelled() {
                finish_reason = FinishReason::Cancelled;
                break;
            }
            std::thread::sleep(Duration::from_millis(step));
            let delta = format!("t{n} ");
            text.push_str(&delta);
            on_delta(delta, None);
        }
        let completion_tokens = text.split_whitespace().count() as u64;
        Ok(GenerateResult {
            text,
            finish_reason,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens,
                total_tokens: completion_tokens + 1,
                cached_tokens: 0,
            },
            timings: Timings::default(),
        })
    }

    fn unload(&mut self, params: &UnloadParams) -> Result<UnloadResult, ResponseError> {
        let unloaded = match &params.model {
            Some(m) => {
                let before = self.models.len();
                self.models.retain(|x| x != m);
                if before == self.models.len() {
                    vec![]
                } else {
                    vec![m.clone()]
                }
            }
            None => std::mem::take(&mut self.models),
        };
        Ok(UnloadResult {
            unloaded,
            memory: MemoryInfo::default(),
        })
    }

    fn reset(&mut self) -> Result<ResetResult, ResponseError> {
        Ok(ResetResult {
            memory: MemoryInfo::default(),
        })
    }

    fn residents(&self) -> Residents {
        Residents {
            active_model: self.models.last().cloned(),
            models: self
                .models
                .iter()
                .map(|m| ResidentModel {
                    model_id: m.clone(),
                    info: info(m),
                })
                .collect(),
            memory: MemoryInfo::default(),
        }
    }

    fn free(&mut self) {
        self.models.clear();
    }
}
