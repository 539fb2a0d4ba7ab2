//! The backend of a build without an engine.

use std::sync::Arc;

use protocol::methods::{
    GenerateParams, GenerateResult, LoadParams, LoadResult, LoadStage, MemoryInfo, MlxInfo,
    ResetResult, TokenLogprob, TokenizeParams, TokenizeResult, UnloadParams, UnloadResult,
};
use protocol::ResponseError;

use crate::backend::{Backend, BackendInfo, CancelFlag, Residents, TokenizeService};

/// The backend of a build without an engine: every engine call fails with a message that says
/// how to build one that works. Nothing pretends to load or generate.
#[derive(Debug, Default)]
pub struct Unavailable;

const NO_ENGINE: &str = "this mlx-worker was built without an inference engine; \
                         build it with `cargo build -p mlx-worker --features mlx`";

struct NoTokenizer;

impl TokenizeService for NoTokenizer {
    fn tokenize(&self, _: &TokenizeParams) -> Result<TokenizeResult, ResponseError> {
        Err(ResponseError::internal(NO_ENGINE))
    }
}

impl Backend for Unavailable {
    type Cancel = CancelFlag;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            mlx: MlxInfo {
                version: "none".into(),
                backend: protocol::methods::Backend::Cpu,
                device: protocol::methods::DeviceInfo {
                    name: "none (built without an engine)".into(),
                    memory_bytes: 0,
                    recommended_working_set_bytes: None,
                },
            },
            architectures: Vec::new(),
            vision: false,
            lora: false,
            gguf: false,
        }
    }
    fn tokenizer(&self) -> Arc<dyn TokenizeService> {
        Arc::new(NoTokenizer)
    }
    fn load(
        &mut self,
        _: &LoadParams,
        _: &CancelFlag,
        _: &mut dyn FnMut(LoadStage, u64, u64, String),
    ) -> Result<LoadResult, ResponseError> {
        Err(ResponseError::internal(NO_ENGINE))
    }
    fn generate(
        &mut self,
        _: &GenerateParams,
        _: &CancelFlag,
        _: &mut dyn FnMut(String, Option<Vec<TokenLogprob>>),
    ) -> Result<GenerateResult, ResponseError> {
        Err(ResponseError::no_model(None))
    }
    fn unload(&mut self, _: &UnloadParams) -> Result<UnloadResult, ResponseError> {
        Ok(UnloadResult {
            unloaded: Vec::new(),
            memory: MemoryInfo::default(),
        })
    }
    fn reset(&mut self) -> Result<ResetResult, ResponseError> {
        Ok(ResetResult {
            memory: MemoryInfo::default(),
        })
    }
    fn residents(&self) -> Residents {
        Residents::default()
    }
    fn free(&mut self) {}
}
