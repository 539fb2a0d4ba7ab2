//! What the dispatcher reads while the MLX thread works: the resident models, their tokenizers
//! and MLX memory. The MLX thread replaces the snapshot after every job; `status` and
//! `tokenize` read it without waiting for the engine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mlx_engine::text::{ModelTokenizer, RenderOptions};
use protocol::methods::{
    MemoryInfo, PromptCacheInfo, ResidentModel, TokenizeParams, TokenizeResult,
};
use protocol::{RequestId, ResponseError};

use crate::convert;
use crate::errors::engine_error;

/// Resident models, their tokenizers and memory, as of the last finished job.
#[derive(Debug, Clone, Default)]
pub struct Residents {
    /// The model `generate` and `tokenize` use by default.
    pub active_model: Option<String>,
    /// Every resident model, in load order.
    pub models: Vec<ResidentModel>,
    /// MLX memory.
    pub memory: MemoryInfo,
    /// The prompt cache's tiers.
    pub prompt_cache: PromptCacheInfo,
    /// Each resident model's tokenizer, by model id.
    pub tokenizers: HashMap<String, Arc<ModelTokenizer>>,
    /// The jobs whose responses the MLX thread has sent and the dispatcher has not yet heard
    /// are done: a host that has
    /// read a response and asks `status` at once must not see its job as still running, even
    /// before the dispatcher has heard that it is done.
    pub finished: Vec<RequestId>,
}

/// The snapshot, shared by the dispatcher and the MLX thread.
pub type SharedResidents = Arc<Mutex<Residents>>;

impl Residents {
    /// Notes that the response of `id` has been sent (until the dispatcher hears it is done).
    pub fn answered(&mut self, id: RequestId) {
        self.finished.push(id);
    }

    /// Whether the response of `id` has been sent.
    pub fn has_answered(&self, id: &RequestId) -> bool {
        self.finished.contains(id)
    }

    /// The tokenizer of `model`, or of the active model;
    /// [`NoModel`](protocol::ErrorCode::NoModel) when it is not resident.
    pub fn tokenizer(&self, model: Option<&str>) -> Result<Arc<ModelTokenizer>, ResponseError> {
        let id = model.or(self.active_model.as_deref());
        id.and_then(|id| self.tokenizers.get(id))
            .cloned()
            .ok_or_else(|| ResponseError::no_model(model))
    }
}

/// `tokenize` with a resident model's tokenizer: `text` as is (with the tokenizer's special
/// tokens, as `generate` does for text), or `messages` through the chat template.
pub fn tokenize(
    tokenizer: &ModelTokenizer,
    params: &TokenizeParams,
) -> Result<TokenizeResult, ResponseError> {
    let template_error = |e: mlx_engine::text::TokenizerError| {
        engine_error(mlx_engine::EngineError::Template(e.to_string()))
    };
    // `Tokenize::validate` let through exactly one of `text` and `messages`.
    let (tokens, prompt) = match &params.messages {
        Some(messages) => {
            let options = RenderOptions {
                add_generation_prompt: params.add_generation_prompt,
                enable_thinking: params.enable_thinking,
                tools: convert::tools(params.tools.as_ref())?,
                extra: convert::template_variables(
                    params.reasoning_effort.as_deref(),
                    params.preserve_thinking,
                ),
                ..RenderOptions::default()
            };
            let messages = convert::messages(messages)?;
            let messages =
                mlx_engine::text::prepend_system_prompt(&params.system_prompt, &messages);
            let rendered = tokenizer
                .render_and_encode(&messages, &options)
                .map_err(template_error)?;
            (rendered.ids, Some(rendered.text))
        }
        None => {
            let text = params.text.as_deref().unwrap_or_default();
            (tokenizer.encode(text, true).map_err(template_error)?, None)
        }
    };
    Ok(TokenizeResult {
        count: tokens.len(),
        tokens,
        prompt,
    })
}
