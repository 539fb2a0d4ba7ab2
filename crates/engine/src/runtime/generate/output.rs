//! Generated tokens turned into deltas: detokenize, hold back what could begin a stop string,
//! split reasoning channels, log-probabilities.

use std::time::Instant;

use mlx_rs::Array;
use text::{StopMatcher, StreamingDetokenizer};

use super::context::Result;
use crate::{
    runtime::constrained::Markup,
    runtime::request::{Channel, Completion, Delta, FinishReason, Timings, TokenLogprob, Usage},
    EngineError,
};

/// Generated tokens turned into deltas: detokenized, stop sequences held back.
pub(super) struct Output<'t> {
    pub(super) detok: StreamingDetokenizer,
    pub(super) stops: StopMatcher,
    pub(super) logprobs: usize,
    pub(super) tokenizer: &'t text::ModelTokenizer,
    pub(super) ids: Vec<u32>,
    pub(super) text: String,
    pub(super) index: usize,
    pub(super) pending_logprobs: Vec<TokenLogprob>,
    pub(super) markup: Option<Markup>,
    /// With markup: the channel of the text held back so far (and of the next token).
    pub(super) channel: Channel,
}

impl<'t> Output<'t> {
    pub(super) fn new(
        detok: StreamingDetokenizer,
        stop: &[String],
        logprobs: usize,
        tokenizer: &'t text::ModelTokenizer,
        markup: Option<Markup>,
    ) -> Self {
        Self {
            detok,
            stops: StopMatcher::new(stop),
            logprobs,
            tokenizer,
            ids: Vec::new(),
            text: String::new(),
            index: 0,
            pending_logprobs: Vec::new(),
            channel: markup
                .as_ref()
                .map_or(Channel::Content, Markup::first_channel),
            markup,
        }
    }

    /// Follows token `id` (its text `piece`) through the markup: whether its text is shown
    /// (harmony's structure is not), and the channel after it. Text held back in another
    /// channel goes out first.
    pub(super) fn switch_channel(
        &mut self,
        id: u32,
        piece: &str,
        on_delta: &mut dyn FnMut(Delta),
    ) -> (bool, Channel) {
        let Some(m) = self.markup.as_mut() else {
            return (true, Channel::Content);
        };
        let (this, after) = m.next(id, piece, self.channel);
        let Some(this) = this else {
            return (false, self.channel);
        };
        if this != self.channel {
            // A stop sequence is not matched across the boundary.
            let held = self.stops.finish();
            self.emit(held, on_delta);
        }
        self.channel = this;
        (true, after)
    }

    /// Adds a token; returns true when a stop sequence ended the generation.
    pub(super) fn push(
        &mut self,
        id: u32,
        logprobs: &Array,
        on_delta: &mut dyn FnMut(Delta),
    ) -> Result<bool> {
        let piece = self
            .detok
            .push(id)
            .map_err(|e| EngineError::Generation(e.to_string()))?;
        let (shown, after) = self.switch_channel(id, &piece, on_delta);
        self.ids.push(id);
        if self.logprobs > 0 {
            self.pending_logprobs
                .push(self.token_logprob(id, logprobs)?);
        }
        if !shown {
            return Ok(false);
        }
        let outcome = self.stops.push(&piece);
        self.emit(outcome.text, on_delta);
        if after != self.channel {
            let held = self.stops.finish();
            self.emit(held, on_delta);
            self.channel = after;
        }
        Ok(outcome.stopped.is_some())
    }

    pub(super) fn emit(&mut self, text: String, on_delta: &mut dyn FnMut(Delta)) {
        if text.is_empty() && self.pending_logprobs.is_empty() {
            return;
        }
        self.text.push_str(&text);
        on_delta(Delta {
            index: self.index,
            text,
            tokens: std::mem::take(&mut self.pending_logprobs),
            channel: self.markup.as_ref().map(|_| self.channel),
        });
        self.index += 1;
    }

    pub(super) fn token_logprob(&self, id: u32, logprobs: &Array) -> Result<TokenLogprob> {
        let lp = logprobs.as_dtype(mlx_rs::Dtype::Float32)?;
        let values = lp.try_as_slice::<f32>()?;
        let mut order: Vec<u32> = (0..values.len() as u32).collect();
        let k = self.logprobs.min(values.len());
        order.select_nth_unstable_by(k - 1, |a, b| {
            values[*b as usize].total_cmp(&values[*a as usize])
        });
        order.truncate(k);
        order.sort_by(|a, b| values[*b as usize].total_cmp(&values[*a as usize]));
        Ok(TokenLogprob {
            id,
            text: self.tokenizer.decode(&[id], false).unwrap_or_default(),
            logprob: values[id as usize],
            top: order.into_iter().map(|t| (t, values[t as usize])).collect(),
        })
    }

    /// Flushes held-back text (unless a stop sequence cut it) and builds the completion.
    pub(super) fn finish_with(
        mut self,
        mut reason: FinishReason,
        usage: Usage,
        timings: Timings,
        on_delta: &mut dyn FnMut(Delta),
    ) -> Completion {
        if reason != FinishReason::StopSequence {
            let tail = self.detok.finish().unwrap_or_default();
            let outcome = self.stops.push(&tail);
            let mut text = outcome.text;
            if outcome.stopped.is_some() {
                reason = FinishReason::StopSequence;
            } else {
                text.push_str(&self.stops.finish());
            }
            self.emit(text, on_delta);
        }
        self.finish(reason, usage, timings)
    }

    pub(super) fn finish(self, reason: FinishReason, usage: Usage, timings: Timings) -> Completion {
        Completion {
            text: self.text,
            token_ids: self.ids,
            finish_reason: reason,
            tool_calls: Vec::new(),
            usage,
            timings,
        }
    }
}

pub(super) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
