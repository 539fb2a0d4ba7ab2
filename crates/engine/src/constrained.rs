//! A request's constraint as the engine runs it: the grammar it asks for (its own, or the forced
//! tool calls of its tools), compiled against the resident's vocabulary, the model's reasoning
//! markup, and the tool calls read back from the output. The grammar engine is `constrain`.

use constrain::{Constraint, ConstraintError, Guide, Reasoning, ToolSyntax, Vocabulary};
use text::ModelTokenizer;

use crate::{
    request::{Completion, FinishReason, GenerateRequest, ToolChoice},
    EngineError,
};

/// What a request with tools asks: the syntax its model writes calls in, and the grammar of
/// forced calls (`required` or a named function).
pub(crate) struct ToolUse {
    pub syntax: ToolSyntax,
    pub forced: Option<Constraint>,
}

impl ToolUse {
    /// `None` without tools or with `tool_choice: none`; an error when calls are forced but the
    /// model's template teaches no syntax the worker knows.
    pub fn of(
        tokenizer: &ModelTokenizer,
        req: &GenerateRequest,
    ) -> Result<Option<Self>, EngineError> {
        if req.tools().is_empty() || req.tool_choice == ToolChoice::None {
            return Ok(None);
        }
        let only = match &req.tool_choice {
            ToolChoice::Required => Some(None),
            ToolChoice::Function(name) => Some(Some(name.clone())),
            ToolChoice::Auto | ToolChoice::None => None,
        };
        let syntax = tokenizer
            .chat_template()
            .and_then(|t| ToolSyntax::detect(t.tools_source()));
        let Some(syntax) = syntax else {
            return match only {
                None => Ok(None),
                Some(_) => Err(EngineError::InvalidParams {
                    field: "tool_choice".into(),
                    reason: "this model's chat template writes tool calls in no syntax the \
                             worker knows (Hermes `<tool_call>`, Llama 3 JSON, Mistral \
                             `[TOOL_CALLS]`): load it with a chat_template_override that does, \
                             or use tool_choice \"auto\""
                        .into(),
                }),
            };
        };
        let forced = only.map(|only| Constraint::ToolCalls {
            syntax,
            tools: req.tools().to_vec(),
            only,
            parallel: req.parallel_tool_calls,
        });
        Ok(Some(Self { syntax, forced }))
    }

    /// Reads the calls `completion` wrote; a stop with calls becomes `ToolCalls`.
    pub fn read_calls(&self, completion: &mut Completion) {
        completion.tool_calls = self.syntax.parse(&completion.text);
        if !completion.tool_calls.is_empty() && completion.finish_reason == FinishReason::Stop {
            completion.finish_reason = FinishReason::ToolCalls;
        }
    }
}

/// A model's reasoning markup as token ids (`<think>`, `</think>`), and whether the output
/// starts inside it (the prompt opened a thought and did not close it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Markup {
    pub open: u32,
    pub close: u32,
    pub inside: bool,
}

impl Markup {
    /// The markup of `tokenizer`, where its vocabulary has `<think>` and `</think>`.
    pub fn of(tokenizer: &ModelTokenizer, prompt: &[u32]) -> Option<Self> {
        let open = tokenizer.token_to_id("<think>")?;
        let close = tokenizer.token_to_id("</think>")?;
        let last = |id| prompt.iter().rposition(|&t| t == id);
        let inside = match (last(open), last(close)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        };
        Some(Self {
            open,
            close,
            inside,
        })
    }
}

/// `constraint` compiled for a resident (before any compute: a bad one is -32602 naming its
/// field); the resident's vocabulary is built on its first constrained request. Returns the
/// guide and the field its later errors name.
pub(crate) fn compile(
    vocabulary: &mut Option<Vocabulary>,
    tokenizer: &ModelTokenizer,
    vocab_size: usize,
    constraint: &Constraint,
    markup: Option<Markup>,
) -> Result<(Guide, &'static str), EngineError> {
    let field = constraint.field();
    let invalid = |e: ConstraintError| match e {
        ConstraintError::Invalid { field, reason } => EngineError::InvalidParams {
            field: field.into(),
            reason,
        },
        other => EngineError::InvalidParams {
            field: field.into(),
            reason: other.to_string(),
        },
    };
    let vocabulary = match vocabulary {
        Some(v) => v,
        empty => empty.insert(
            Vocabulary::new(tokenizer.inner(), tokenizer.eos_token_ids(), vocab_size)
                .map_err(invalid)?,
        ),
    };
    let reasoning = markup.map(|m| Reasoning {
        open: "<think>".into(),
        close: "</think>".into(),
        inside: m.inside,
    });
    let guide = Guide::new(vocabulary, constraint, reasoning.as_ref()).map_err(invalid)?;
    Ok((guide, field))
}
