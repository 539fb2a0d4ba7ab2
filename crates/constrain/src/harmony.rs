//! gpt-oss's harmony format: messages `<|start|>{header}<|message|>{body}<|end|>`, the header
//! naming the channel (`<|channel|>analysis`, `final`, `commentary`) and, for a tool call, its
//! recipient (`to=functions.NAME`) and `<|constrain|>json`; `<|return|>` ends the answer,
//! `<|call|>` a call. The markers are special tokens (the detokenizer skips them), so what part
//! of the output a token belongs to is told by token ids here, never by text.

use std::collections::BTreeSet;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::tools::{functions, ToolCall};

/// Harmony's marker tokens, by name.
const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";

/// The most analysis or commentary messages a constrained output may open with. gpt-oss writes
/// one or two; the bound keeps a model that keeps opening messages from never reaching the
/// one the constraint holds.
const MAX_PREAMBLES: usize = 8;

/// The ids of harmony's marker tokens in a model's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Harmony {
    start: u32,
    end: u32,
    message: u32,
    channel: u32,
    constrain: u32,
    ret: u32,
    call: u32,
}

impl Harmony {
    /// The one place a model is told to write harmony: its tokenizer has every marker token and
    /// its chat template writes `<|channel|>`.
    pub fn detect(tokenizer: &Tokenizer, template: Option<&str>) -> Option<Self> {
        if !template?.contains(CHANNEL) {
            return None;
        }
        let id = |name| tokenizer.token_to_id(name);
        Some(Self {
            start: id(START)?,
            end: id(END)?,
            message: id(MESSAGE)?,
            channel: id(CHANNEL)?,
            constrain: id(CONSTRAIN)?,
            ret: id(RETURN)?,
            call: id(CALL)?,
        })
    }

    fn is_marker(&self, id: u32) -> bool {
        [
            self.start,
            self.end,
            self.message,
            self.channel,
            self.constrain,
            self.ret,
            self.call,
        ]
        .contains(&id)
    }

    /// A splitter positioned where `prompt` ends: in the header its last `<|start|>` opened (a
    /// generation prompt's `<|start|>assistant`), inside a message body the prompt opened, or
    /// (a prompt with no harmony message) in content. `piece` is a prompt token's text.
    pub fn splitter(&self, prompt: &[u32], piece: impl Fn(u32) -> String) -> Splitter {
        let mut splitter = Splitter {
            harmony: *self,
            part: Part::Content,
            channel: String::new(),
        };
        if let Some(from) = prompt.iter().rposition(|&id| id == self.start) {
            for &id in &prompt[from..] {
                splitter.push(id, &piece(id));
            }
        }
        splitter
    }

    /// A Lark token reference to `id`, or nothing when `id` ends a generation anyway (an
    /// end-of-sequence id: the grammar ends there and the guide allows the model's EOS ids).
    fn closing(id: u32, eos: &BTreeSet<u32>) -> String {
        match eos.contains(&id) {
            true => String::new(),
            false => format!("<[{id}]>"),
        }
    }

    /// What comes before the message a constraint holds, from where the prompt left the output
    /// (`opening`): the rest of a body the prompt opened (free text up to `<|end|>`, then the
    /// next message's `<|start|>assistant`), then up to [`MAX_PREAMBLES`] preambles: analysis
    /// or commentary messages without a recipient, as gpt-oss writes before its answer or a
    /// call.
    fn lead(&self, opening: Opening) -> String {
        let Self { end, start, .. } = self;
        let rest_of_body = match opening {
            Opening::Header => String::new(),
            Opening::Message | Opening::Final => {
                format!("thought? <[{end}]> <[{start}]> \"assistant\" ")
            }
        };
        format!("{rest_of_body}preamble{{0,{MAX_PREAMBLES}}}")
    }

    /// The rules [`Self::lead`] uses.
    fn preamble_rules(&self) -> String {
        let Self {
            channel,
            message,
            end,
            start,
            ..
        } = self;
        format!(
            "preamble: <[{channel}]> preamble_channel <[{message}]> thought? <[{end}]> <[{start}]> \"assistant\"\n\
             preamble_channel: \"analysis\" | \"commentary\"\n\
             thought: /(.|\\n)+/\n"
        )
    }

    /// `content` (a constraint's grammar) as the body of the final message, after what the
    /// model may write before it: the reasoning and preambles are free, the answer is held to
    /// the constraint. When the prompt opened the final message, `content` is the rest of it.
    pub(crate) fn wrap(
        &self,
        content: TopLevelGrammar,
        eos: &BTreeSet<u32>,
        opening: Opening,
    ) -> TopLevelGrammar {
        let mut grammars = content.grammars;
        grammars[0].name = Some("content".into());
        let (channel, message) = (self.channel, self.message);
        let close = Self::closing(self.ret, eos);
        let lark = match opening {
            Opening::Final => format!("start: @content {close}\n"),
            _ => format!(
                "start: {} <[{channel}]> \"final\" <[{message}]> @content {close}\n{}",
                self.lead(opening),
                self.preamble_rules()
            ),
        };
        grammars.insert(0, GrammarWithLexer::from_lark(lark));
        TopLevelGrammar {
            grammars,
            max_tokens: content.max_tokens,
        }
    }

    /// A Lark grammar of one call of `tools` (the named one only, with `only`), after what the
    /// model may write before it ([`Self::lead`]): `<|channel|>commentary to=functions.NAME
    /// <|constrain|>json<|message|>` then the arguments as JSON valid against the tool's
    /// parameters, then `<|call|>`. Harmony makes one call per turn (`<|call|>` stops the
    /// model), whatever `parallel_tool_calls` says. A final message the prompt opened is ended
    /// (`<|end|>`) before the call.
    pub(crate) fn tool_grammar(
        &self,
        tools: &[Value],
        only: Option<&str>,
        eos: &BTreeSet<u32>,
        opening: Opening,
    ) -> Result<String, String> {
        let Self {
            channel,
            constrain,
            message,
            ..
        } = *self;
        let close = Self::closing(self.call, eos);
        let mut lark = format!("start: {} call\n", self.lead(opening));
        let mut calls = Vec::new();
        for (i, (name, parameters)) in functions(tools, only)?.into_iter().enumerate() {
            let recipient = serde_json::Value::from(format!("commentary to=functions.{name} "));
            let arguments = crate::constraint::compact(parameters);
            lark.push_str(&format!(
                "call_{i}: <[{channel}]> {recipient} <[{constrain}]> \"json\" <[{message}]> arguments_{i} {close}\n\
                 arguments_{i}: %json {arguments}\n"
            ));
            calls.push(format!("call_{i}"));
        }
        lark.push_str(&format!("call: {}\n", calls.join(" | ")));
        lark.push_str(&self.preamble_rules());
        Ok(lark)
    }

    /// The calls in `text`, the output decoded with its special tokens: every message whose
    /// header names a `functions.` recipient and whose body is JSON.
    pub(crate) fn parse(text: &str) -> Vec<ToolCall> {
        text.split(START)
            .filter_map(|message| {
                let (header, body) = message.split_once(MESSAGE)?;
                let (_, recipient) = header.split_once("to=functions.")?;
                let name: String = recipient
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != '<')
                    .collect();
                let body = [END, CALL, RETURN]
                    .iter()
                    .filter_map(|marker| body.find(marker))
                    .min()
                    .map_or(body, |cut| &body[..cut]);
                let arguments: Value = serde_json::from_str(body.trim()).ok()?;
                (!name.is_empty()).then(|| ToolCall {
                    name,
                    arguments: arguments.to_string(),
                })
            })
            .collect()
    }
}

/// Where a prompt leaves a generation's output in harmony's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A message's header, after its `<|start|>assistant` (a generation prompt), or no harmony
    /// message at all.
    Header,
    /// Inside the body of a message that is not the final one (the prompt ended
    /// `<|channel|>analysis<|message|>`, or a commentary preamble's).
    Message,
    /// Inside the body of the final message.
    Final,
}

/// What part of a harmony output a token belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A marker, or a header's text (role, channel, recipient, content type): structure, not
    /// text to show.
    Header,
    /// The body of an `analysis` message.
    Reasoning,
    /// The body of any other message (`final`, a `commentary` preamble, a call's arguments).
    Content,
}

/// Follows a harmony output token by token.
#[derive(Debug, Clone)]
pub struct Splitter {
    harmony: Harmony,
    part: Part,
    /// The header's text since `<|channel|>`: the channel, a recipient, a content type.
    channel: String,
}

impl Splitter {
    /// The part token `id` (whose text is `piece`) belongs to: markers and header text are
    /// `Header`; `<|message|>` opens a body, reasoning when the header's channel is `analysis`.
    pub fn push(&mut self, id: u32, piece: &str) -> Part {
        let h = &self.harmony;
        if id == h.message {
            let analysis = self.channel.split_whitespace().next() == Some("analysis");
            self.part = if analysis {
                Part::Reasoning
            } else {
                Part::Content
            };
            return Part::Header;
        }
        if h.is_marker(id) {
            if id == h.channel {
                self.channel.clear();
            }
            self.part = Part::Header;
            return Part::Header;
        }
        if self.part == Part::Header {
            self.channel.push_str(piece);
        }
        self.part
    }

    /// Where the output after the tokens pushed so far starts.
    pub fn opening(&self) -> Opening {
        let channel = self.channel.split_whitespace().next();
        match (self.part, channel) {
            (Part::Reasoning, _) => Opening::Message,
            (Part::Content, Some("final")) => Opening::Final,
            (Part::Content, Some(_)) => Opening::Message,
            (Part::Content, None) | (Part::Header, _) => Opening::Header,
        }
    }

    /// The part the next token's text will belong to, unless it changes it.
    pub fn part(&self) -> Part {
        self.part
    }
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
