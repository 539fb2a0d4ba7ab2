//! A request's constraint as the engine runs it: the grammar it asks for (its own, or the forced
//! tool calls of its tools), compiled against the resident's vocabulary, the model's reasoning
//! markup, and the tool calls read back from the output. The grammar engine is `constrain`.

use constrain::{
    Constraint, ConstraintError, Guide, Harmony, Part, Reasoning, Splitter, ToolSyntax, Vocabulary,
};
use text::ModelTokenizer;

use crate::{
    runtime::request::{Channel, Completion, FinishReason, GenerateRequest, ToolChoice},
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
        let template = tokenizer.chat_template().map(|t| t.tools_source());
        let syntax = ToolSyntax::of(tokenizer.inner(), template);
        let Some(syntax) = syntax else {
            return match only {
                None => Ok(None),
                Some(_) => Err(EngineError::InvalidParams {
                    field: "tool_choice".into(),
                    reason: "this model's chat template writes tool calls in no syntax the \
                             worker knows (Hermes `<tool_call>`, Llama 3 JSON, Mistral \
                             `[TOOL_CALLS]`, harmony): load it with a chat_template_override that does, \
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

    /// Reads the calls `completion` wrote; a stop with calls becomes `ToolCalls`. Harmony's are
    /// read from the output's tokens with their markers (the text has none).
    pub fn read_calls(&self, completion: &mut Completion, tokenizer: &ModelTokenizer) {
        completion.tool_calls = match self.syntax {
            ToolSyntax::Harmony(_) => {
                let marked = tokenizer.decode(&completion.token_ids, false);
                self.syntax.parse(&marked.unwrap_or_default())
            }
            _ => self.syntax.parse(&completion.text),
        };
        if !completion.tool_calls.is_empty() && completion.finish_reason == FinishReason::Stop {
            completion.finish_reason = FinishReason::ToolCalls;
        }
    }
}

/// A model's reasoning markup, followed token by token: `<think>` and `</think>` as token ids
/// (and whether the output starts inside a thought the prompt opened), or harmony's channels.
#[derive(Debug, Clone)]
pub(crate) enum Markup {
    Think { open: u32, close: u32, inside: bool },
    Harmony(Harmony, Splitter),
}

impl Markup {
    /// The markup of `tokenizer`: harmony where [`Harmony::detect`] finds it, else `<think>`
    /// and `</think>` where its vocabulary has them; positioned at the end of `prompt`.
    pub fn of(tokenizer: &ModelTokenizer, prompt: &[u32]) -> Option<Self> {
        let template = tokenizer.chat_template().map(|t| t.source());
        if let Some(harmony) = Harmony::detect(tokenizer.inner(), template) {
            let piece = |id| tokenizer.decode(&[id], true).unwrap_or_default();
            return Some(Self::Harmony(harmony, harmony.splitter(prompt, piece)));
        }
        let open = tokenizer.token_to_id("<think>")?;
        let close = tokenizer.token_to_id("</think>")?;
        let last = |id| prompt.iter().rposition(|&t| t == id);
        let inside = match (last(open), last(close)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        };
        Some(Self::Think {
            open,
            close,
            inside,
        })
    }

    /// The channel of the output's first text.
    pub fn first_channel(&self) -> Channel {
        match self {
            Markup::Think { inside: true, .. } => Channel::Reasoning,
            Markup::Think { .. } => Channel::Content,
            Markup::Harmony(_, splitter) => match splitter.part() {
                Part::Reasoning => Channel::Reasoning,
                Part::Content | Part::Header => Channel::Content,
            },
        }
    }

    /// Follows token `id` (its text `piece`) from channel `current`: the channel of its text
    /// (`None` for harmony's structure, text never shown) and the channel after it. `<think>`
    /// starts a thought, `</think>` is its last token.
    pub fn next(&mut self, id: u32, piece: &str, current: Channel) -> (Option<Channel>, Channel) {
        match self {
            Markup::Think { open, close, .. } => match current {
                Channel::Content if id == *open => (Some(Channel::Reasoning), Channel::Reasoning),
                Channel::Reasoning if id == *close => (Some(Channel::Reasoning), Channel::Content),
                current => (Some(current), current),
            },
            Markup::Harmony(_, splitter) => match splitter.push(id, piece) {
                Part::Header => (None, current),
                Part::Reasoning => (Some(Channel::Reasoning), Channel::Reasoning),
                Part::Content => (Some(Channel::Content), Channel::Content),
            },
        }
    }

    /// The markup as the grammar engine wraps a constraint in it.
    fn reasoning(&self) -> Reasoning {
        match self {
            Markup::Think { inside, .. } => Reasoning::Tags {
                open: "<think>".into(),
                close: "</think>".into(),
                inside: *inside,
            },
            Markup::Harmony(harmony, splitter) => Reasoning::Harmony(*harmony, splitter.opening()),
        }
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
    markup: Option<&Markup>,
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
    let reasoning = markup.map(Markup::reasoning);
    let guide = Guide::new(vocabulary, constraint, reasoning.as_ref()).map_err(invalid)?;
    Ok((guide, field))
}
