//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`: Llama 2, Gemma, ...) as a Hugging
//! Face `tokenizers` BPE.
//!
//! The GGUF has the pieces, their scores and types, but no merges list. SentencePiece BPE merges
//! the adjacent pair whose joined piece scores best, so every way of cutting a piece into two
//! pieces of the vocabulary is a merge, ranked by the joined piece's score. Spaces are written
//! `▁` in the pieces, so the normalizer maps " " to "▁" (and prepends one when
//! `tokenizer.ggml.add_space_prefix` says so); there is no pre-tokenizer, and characters outside
//! the vocabulary fall back to the `<0xNN>` byte tokens.

use std::cmp::Ordering;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence};
use tokenizers::Tokenizer;

use crate::tokenizer::{
    add_vocabulary_tokens, template_processor, token_types, vocab_map, vocabulary, SpecialTokens,
    TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED,
};
use crate::{GgufFile, ImportError};

/// How SentencePiece writes a space inside a piece.
const SPACE: &str = "\u{2581}";

/// Builds the tokenizer for a `tokenizer.ggml.model = llama` vocabulary.
pub(crate) fn sentencepiece_bpe(file: &GgufFile) -> Result<Tokenizer, ImportError> {
    let mut tokens = vocabulary(file)?;
    let types = token_types(file, tokens.len())?;
    let scores: Vec<f64> = file.require("tokenizer.ggml.scores")?;
    if scores.len() != tokens.len() {
        return Err(ImportError::Inconsistent(format!(
            "{} token scores for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let special = SpecialTokens::from_gguf(file)?;
    // llama.cpp's default for SentencePiece vocabularies that do not say.
    let add_space_prefix: bool = file
        .get_as("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);

    // llama.cpp writes Gemma's whitespace-run pieces ("▁▁", ...) with real spaces; the model
    // only ever sees normalized text, so spell them back. They stay in the model (reached by
    // merges) instead of becoming added tokens.
    let mut respelled = vec![false; tokens.len()];
    for (token, flag) in tokens.iter_mut().zip(&mut respelled) {
        if !token.is_empty() && token.chars().all(|c| c == ' ') {
            *token = SPACE.repeat(token.len());
            *flag = true;
        }
    }
    let vocab = vocab_map(&tokens)?;
    let merges = derive_merges(&tokens, &types, &scores, &vocab);

    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = special.unk.and_then(|id| tokens.get(id as usize)) {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| ImportError::Tokenizer(e.to_string()))?;

    let mut tokenizer = Tokenizer::new(bpe);
    let space_to_piece: NormalizerWrapper = replace(" ", SPACE)?.into();
    let normalizer = match add_space_prefix {
        true => Sequence::new(vec![Prepend::new(SPACE.into()).into(), space_to_piece]).into(),
        false => space_to_piece,
    };
    tokenizer.with_normalizer(Some(normalizer));
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace(SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    tokenizer.with_post_processor(template_processor(&special, &tokens)?);
    add_vocabulary_tokens(&mut tokenizer, &tokens, &types, |id| respelled[id]);
    Ok(tokenizer)
}

fn replace(pattern: &str, content: &str) -> Result<Replace, ImportError> {
    Replace::new(pattern, content).map_err(|e| ImportError::Tokenizer(e.to_string()))
}

/// Every split of a piece into two vocabulary pieces, best first.
///
/// Only normal and user-defined pieces are merge results (SentencePiece never builds control or
/// byte pieces by merging). User-defined pieces rank first, by id: SentencePiece matches them
/// whole before merging anything, and their GGUF scores are placeholders. Normal pieces rank by
/// score, higher first; ties by the joined piece's id, then the left and right pieces' ids.
pub(crate) fn derive_merges(
    tokens: &[String],
    types: &[i64],
    scores: &[f64],
    vocab: &Vocab,
) -> Vec<(String, String)> {
    // (user-defined first, score, joined id, left id, right id)
    let mut ranked: Vec<(bool, f64, u32, u32, u32)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        let user_defined = match types[id] {
            TOKEN_TYPE_NORMAL => false,
            TOKEN_TYPE_USER_DEFINED => true,
            _ => continue,
        };
        for (cut, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(cut);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((user_defined, scores[id], id as u32, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| match a.0 {
                true => Ordering::Equal,
                false => b.1.total_cmp(&a.1),
            })
            .then_with(|| (a.2, a.3, a.4).cmp(&(b.2, b.3, b.4)))
    });
    ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}

#[cfg(test)]
#[path = "tokenizer_spm_tests.rs"]
mod tests;
