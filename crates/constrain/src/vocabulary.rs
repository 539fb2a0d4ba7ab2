//! A model's vocabulary as the grammar engine sees it: every token's bytes in a trie, and the
//! factory that compiles constraints against it. Built once per resident model.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{token_bytes_from_tokenizer_json, ParserFactory};
use tokenizers::Tokenizer;

use crate::ConstraintError;

/// A model's tokens for the grammar engine, and its end-of-sequence ids.
pub struct Vocabulary {
    pub(crate) factory: ParserFactory,
    /// Every id that ends a generation; the trie knows only the first as its EOS.
    pub(crate) eos: BTreeSet<u32>,
    /// The model's vocabulary size (its logits' width): can exceed the tokenizer's.
    pub(crate) size: usize,
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` padded to the model's `size` (ids past the tokenizer are
    /// never allowed), with `eos` the ids that end a generation.
    pub fn new(
        tokenizer: &Tokenizer,
        eos: &BTreeSet<u32>,
        size: usize,
    ) -> Result<Self, ConstraintError> {
        let bad = |e: String| ConstraintError::Vocabulary(e);
        let json = tokenizer.to_string(false).map_err(|e| bad(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| bad(e.to_string()))?;
        // llguidance asserts on some malformed byte-fallback names: a panic here is a vocabulary
        // it cannot read, not a crash of the worker.
        let mut words = catch_unwind(AssertUnwindSafe(|| token_bytes_from_tokenizer_json(&json)))
            .map_err(|_| bad("a byte-fallback token name is malformed".into()))?
            .map_err(|e| bad(e.to_string()))?;
        if words.len() > size {
            return Err(bad(format!(
                "the tokenizer has {} tokens, more than the model's {size} logits",
                words.len()
            )));
        }
        words.resize(size, Vec::new());
        let &first_eos = eos
            .first()
            .ok_or_else(|| bad("the model has no end-of-sequence token".into()))?;
        let info = TokRxInfo::new(size as u32, first_eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            eos: eos.clone(),
            size,
        })
    }
}

impl Vocabulary {
    /// The id of the special token `name` (e.g. `[TOOL_CALLS]`), if the tokenizer has one.
    pub(crate) fn special_token(&self, name: &str) -> Option<u32> {
        self.factory.tok_env().tok_trie().get_special_token(name)
    }
}

/// The tokenizer behind the trie: llguidance tokenizes the grammar's literal strings with it.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}
