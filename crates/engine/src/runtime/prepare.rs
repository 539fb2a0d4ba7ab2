//! A request made ready for a resident ([`prepare`]: template, images, constraint, the
//! context limit), what its generation reads ([`View::context`]), and what follows it
//! ([`finish`]).

use std::time::Instant;

use crate::{
    error::EngineError,
    layers::device,
    layers::distributed::Group,
    runtime::constrained::{self, Markup, ToolUse},
    runtime::generate::GenerationContext,
    runtime::prompt,
    runtime::request::*,
    runtime::resident::View,
};

/// A request made ready to run on a resident: its prompt, its constraint compiled, its tools.
pub(crate) struct Prepared {
    /// The request, `max_new_tokens` cut to what the context leaves.
    pub req: GenerateRequest,
    pub prompt: prompt::PromptInputs,
    pub tools: Option<ToolUse>,
    pub guide: Option<(constrain::Guide, &'static str)>,
    pub markup: Option<Markup>,
    /// Whether the resident's adapter (if any) is on for it.
    pub adapter_on: bool,
}

/// Checks `req` against the resident `view` shows and makes it ready: template, images, the
/// constraint (or forced tool calls) compiled, the context limit.
pub(crate) fn prepare(
    view: View<'_>,
    vocabulary: &mut Option<constrain::Vocabulary>,
    req: &GenerateRequest,
) -> Result<Prepared, EngineError> {
    let method = req.speculative.map(|s| s.method);
    if let (Some(Drafts::DraftModel), None) = (method, view.draft) {
        return Err(EngineError::InvalidParams {
            field: "speculative.method".into(),
            reason: "the model was loaded without a `draft_model`: load it with one, or use \
                     \"prompt_lookup\""
                .into(),
        });
    }
    if method == Some(Drafts::Mtp) && view.model.mtp_depth() == 0 {
        return Err(EngineError::InvalidParams {
            field: "speculative.method".into(),
            reason: "this model's checkpoint has no multi-token-prediction head (`mtp.*` \
                     layers, as Qwen3.5's releases keep): use \"prompt_lookup\", or load a \
                     `draft_model`"
                .into(),
        });
    }
    let tools = ToolUse::of(view.tokenizer, req)?;
    let constraint = req
        .constraint
        .as_ref()
        .or_else(|| tools.as_ref()?.forced.as_ref());
    let prompt = prompt::prompt_inputs(view.tokenizer, view.vision, &req.prompt)?;
    let markup = Markup::of(view.tokenizer, &prompt.ids);
    let vocab_size = view.info.vocab_size.max(1);
    // A raw prompt's ids come from the host; a template's from the tokenizer.
    if let crate::runtime::request::Prompt::Tokens(ids) = &req.prompt {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(EngineError::InvalidParams {
                field: "prompt_ids".into(),
                reason: format!("token id {id} is outside the vocabulary (0..{vocab_size})"),
            });
        }
    }
    let guide = constraint
        .map(|c| constrained::compile(vocabulary, view.tokenizer, vocab_size, c, markup.as_ref()))
        .transpose()?;
    let (n, context) = (prompt.ids.len(), view.info.context_length);
    if n > context {
        return Err(EngineError::ContextOverflow {
            prompt_tokens: n,
            context_length: context,
        });
    }
    let mut req = req.clone();
    req.max_new_tokens = req.max_new_tokens.min(context - n);
    let adapter_on = view.adapter_on(&req);
    Ok(Prepared {
        req,
        prompt,
        tools,
        guide,
        markup,
        adapter_on,
    })
}

impl<'r> View<'r> {
    /// Whether `req` runs with the resident's adapter on.
    pub fn adapter_on(&self, req: &GenerateRequest) -> bool {
        self.adapter.is_some() && req.use_adapter != Some(false)
    }

    /// What generating `prep` needs; sets the adapter's switch for it.
    pub fn context(
        &self,
        prep: &Prepared,
        started: Instant,
        prefill_chunk: usize,
        group: Option<&'r Group>,
    ) -> GenerationContext<'r> {
        if let Some(switch) = self.adapter {
            switch.set(prep.adapter_on);
        }
        GenerationContext {
            model: self.model,
            draft: self.draft,
            vision: self.vision,
            image_features: self.image_features,
            tokenizer: self.tokenizer,
            eos: self.tokenizer.eos_token_ids(),
            vocab_size: self.info.vocab_size.max(1),
            kv_bits: self.info.kv_bits.map(i32::from),
            adapter_on: prep.adapter_on,
            prefill_chunk,
            markup: prep.markup.clone(),
            started,
            group,
            batching: self.model.facts().batching,
        }
    }
}

/// After a generation: its tool calls read; after an error, MLX left clean for the next.
pub(crate) fn finish(
    view: View<'_>,
    tools: Option<&ToolUse>,
    result: &mut Result<Completion, EngineError>,
) {
    if let (Ok(completion), Some(tools)) = (result.as_mut(), tools) {
        tools.read_calls(completion, view.tokenizer);
    }
    if result.is_err() {
        // An MLX error mid-graph can leave work, buffers and a stream error behind (steps
        // queued ahead of the one that failed): start the next request clean.
        let _ = device::synchronize();
        let _ = mlx_rs::memory::clear_cache();
    }
}
