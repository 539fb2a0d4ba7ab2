//! `StreamingDetokenizer`: token ids in, new text out, with O(1) work per token.
//!
//! Decoding one token alone is wrong (byte-level BPE splits characters over tokens;
//! SentencePiece decoders drop the leading space of the first token), and decoding the whole
//! sequence at every step is quadratic. So a small window of recent tokens is decoded: the
//! tokens already emitted that the window starts with (the prefix) give the decoder its
//! context, and the text past the prefix's text is new. The window moves forward whenever new
//! text is emitted, so it stays a few tokens long.
//!
//! Text that ends in U+FFFD is held back: the last token ended inside a multi-byte character
//! and the next tokens complete it. The window is cut only where the text decoded so far ends
//! in a whole character, which is what makes the deltas add up to a full decode.

use std::collections::HashSet;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::tokenizer::TokenizerError;

/// Past this many held-back tokens the text is emitted even though it ends in U+FFFD: it is
/// not an unfinished character (those take at most four byte tokens) but text that really
/// holds replacement characters or broken bytes, and waiting longer would make each step
/// slower.
const MAX_HELD_TOKENS: usize = 16;

/// Turns generated token ids into text deltas, one token at a time. Special tokens are
/// skipped. One per generation; get one from [`crate::ModelTokenizer::detokenizer`].
///
/// The concatenation of every delta and [`finish`](Self::finish) equals
/// `decode(all ids, skip_special_tokens = true)`. The one exception is byte tokens of broken
/// UTF-8 (garbage output), where a byte-fallback decoder may decide later that bytes it
/// already let through as a character were part of an invalid run.
#[derive(Debug, Clone)]
pub struct StreamingDetokenizer {
    tokenizer: Arc<Tokenizer>,
    special_ids: Arc<HashSet<u32>>,
    /// The prefix (already emitted) followed by the tokens not emitted yet.
    window: Vec<u32>,
    /// Where the tokens not emitted yet start in `window`.
    read: usize,
    /// Length of the decoded prefix, `decode(window[..read])`.
    prefix_len: usize,
}

impl StreamingDetokenizer {
    /// A detokenizer over `tokenizer`; ids in `special_ids` produce no text.
    pub fn new(tokenizer: Arc<Tokenizer>, special_ids: Arc<HashSet<u32>>) -> Self {
        StreamingDetokenizer {
            tokenizer,
            special_ids,
            window: Vec::new(),
            read: 0,
            prefix_len: 0,
        }
    }

    /// Adds one token and returns the text it completes (often empty while a multi-byte
    /// character is unfinished).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        if self.special_ids.contains(&id) {
            return Ok(String::new());
        }
        self.window.push(id);
        let text = self.decode(&self.window)?;
        let held = self.window.len() - self.read;
        let complete = !text.ends_with('\u{FFFD}') || held > MAX_HELD_TOKENS;
        let delta = match text.get(self.prefix_len..) {
            Some(delta) if complete && !delta.is_empty() => delta.to_owned(),
            _ => return Ok(String::new()),
        };
        // The emitted tokens become the next prefix.
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.prefix_len = self.decode(&self.window)?.len();
        Ok(delta)
    }

    /// Ends the stream: returns the text still held back (an unfinished character comes out
    /// as U+FFFD, as a full decode would write it) and starts over.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        let text = self.decode(&self.window)?;
        let rest = text.get(self.prefix_len..).unwrap_or_default().to_owned();
        self.window.clear();
        self.read = 0;
        self.prefix_len = 0;
        Ok(rest)
    }

    /// How many tokens the decode window holds now: a handful, whatever the length of the
    /// generation (the measure of the O(1) claim).
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(TokenizerError::Tokenizers)
    }
}
