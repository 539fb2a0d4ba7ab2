//! Rebuilding a Hugging Face `tokenizers` tokenizer from a GGUF's `tokenizer.ggml.*` metadata.
//!
//! Supported: byte-level BPE (`tokenizer.ggml.model = gpt2`) with the `smollm` and GPT-2
//! pre-tokenizers and the split rules of [`SPLIT_RULES`] (Qwen2, Llama 3, Tekken, GPT-4o), and SentencePiece-style BPE (`llama`, in `tokenizer_spm.rs`). Other models
//! and pre-tokenizers are refused with a message naming them.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::{GgufFile, ImportError};

/// GGUF token type of ordinary vocabulary pieces.
pub(crate) const TOKEN_TYPE_NORMAL: i64 = 1;
/// GGUF token type of control tokens (`<|im_start|>` and the like): special in Hugging Face terms.
pub(crate) const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens: added, but not special.
pub(crate) const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Special token ids and flags from `tokenizer.ggml.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (false when absent).
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token` (false when absent).
    pub add_eos: bool,
}

impl SpecialTokens {
    /// Reads the special token metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ImportError> {
        Ok(Self {
            bos: file.get_as("tokenizer.ggml.bos_token_id")?,
            eos: file.get_as("tokenizer.ggml.eos_token_id")?,
            pad: file.get_as("tokenizer.ggml.padding_token_id")?,
            unk: file.get_as("tokenizer.ggml.unknown_token_id")?,
            add_bos: file
                .get_as("tokenizer.ggml.add_bos_token")?
                .unwrap_or(false),
            add_eos: file
                .get_as("tokenizer.ggml.add_eos_token")?
                .unwrap_or(false),
        })
    }
}

/// The vocabulary as GGUF lists it: token strings, indexed by id.
pub fn vocabulary(file: &GgufFile) -> Result<Vec<String>, ImportError> {
    Ok(file.require("tokenizer.ggml.tokens")?)
}

/// Builds the tokenizer described by the metadata.
pub fn tokenizer_from_gguf(file: &GgufFile) -> Result<Tokenizer, ImportError> {
    let model: String = file.require("tokenizer.ggml.model")?;
    match model.as_str() {
        "gpt2" => byte_level_bpe(file),
        "llama" => crate::tokenizer_spm::sentencepiece_bpe(file),
        _ => Err(ImportError::Tokenizer(format!(
            "tokenizer.ggml.model = {model:?} is not supported yet (supported: \"gpt2\", byte-level \
             BPE; \"llama\", SentencePiece BPE); add it in crates/gguf/src/tokenizer.rs"
        ))),
    }
}

/// `tokenizer.ggml.token_type`, one per token (all normal when absent).
pub(crate) fn token_types(file: &GgufFile, n_tokens: usize) -> Result<Vec<i64>, ImportError> {
    let token_types: Vec<i64> = file
        .get_as("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![TOKEN_TYPE_NORMAL; n_tokens]);
    if token_types.len() != n_tokens {
        return Err(ImportError::Inconsistent(format!(
            "{} token types for {n_tokens} tokens",
            token_types.len()
        )));
    }
    Ok(token_types)
}

/// Token -> id, refusing a vocabulary that lists a token twice.
pub(crate) fn vocab_map(tokens: &[String]) -> Result<Vocab, ImportError> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect();
    if vocab.len() != tokens.len() {
        return Err(ImportError::Inconsistent(format!(
            "tokenizer.ggml.tokens lists {} tokens but only {} distinct ones",
            tokens.len(),
            vocab.len()
        )));
    }
    Ok(vocab)
}

/// Registers control tokens as special added tokens and user-defined ones as plain added
/// tokens (matched whole in the raw text, as llama.cpp does), except those `keep_in_model`
/// leaves to the model. Both are already in the vocabulary, so they keep their ids.
pub(crate) fn add_vocabulary_tokens(
    tokenizer: &mut Tokenizer,
    tokens: &[String],
    token_types: &[i64],
    keep_in_model: impl Fn(usize) -> bool,
) {
    let of_type = |wanted: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(token_types)
            .enumerate()
            .filter(|&(id, (_, &ty))| ty == wanted && !keep_in_model(id))
            .map(|(_, (token, _))| AddedToken::from(token.clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(&of_type(TOKEN_TYPE_CONTROL, true));
    tokenizer.add_tokens(&of_type(TOKEN_TYPE_USER_DEFINED, false));
}

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`) with its merges list.
fn byte_level_bpe(file: &GgufFile) -> Result<Tokenizer, ImportError> {
    let tokens = vocabulary(file)?;
    let token_types = token_types(file, tokens.len())?;
    let merges: Vec<String> = file.require("tokenizer.ggml.merges")?;
    let special = SpecialTokens::from_gguf(file)?;
    let vocab = vocab_map(&tokens)?;
    let merges = merges
        .iter()
        .map(|m| {
            // Byte-level tokens never contain a space (it is mapped to 'Ġ'), so one space
            // separates the pair.
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| ImportError::Tokenizer(format!("merge {m:?} is not a pair")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| ImportError::Tokenizer(e.to_string()))?;

    let mut tokenizer = Tokenizer::new(bpe);
    let pre: Option<String> = file.get_as("tokenizer.ggml.pre")?;
    if pre.as_deref() == Some(QWEN2) {
        // Qwen2's tokenizer.json composes text (NFC) before splitting; llama.cpp does not.
        tokenizer.with_normalizer(Some(NFC));
    }
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer(pre.as_deref())?));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let processor = match template_processor(&special, &tokens)? {
        Some(template) => template,
        None => ByteLevel::new(true, false, true).into(),
    };
    tokenizer.with_post_processor(Some(processor));
    add_vocabulary_tokens(&mut tokenizer, &tokens, &token_types, |_| false);
    Ok(tokenizer)
}

/// `tokenizer.ggml.pre` of Qwen2, Qwen2.5, Qwen3 and Qwen3-MoE files.
const QWEN2: &str = "qwen2";

/// Qwen2's split rule (its tokenizer.json's, which llama.cpp's `qwen2` pre-tokenizer spells with
/// case classes instead of `(?i:...)`): contractions, letters with at most one leading
/// non-letter, single digits, punctuation runs, newlines, other whitespace.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's: Qwen2's with digits in runs of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken (Nemo and later): words split before capitals, single digits, no
/// contractions.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's o200k (GPT-OSS, Llama 4): Tekken's words with contractions attached, digits in runs
/// of up to three.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` names whose text is split by one rule before byte-level BPE (the
/// families' tokenizer.json pipelines; transformers' GGUF tokenizer builder has the same table).
const SPLIT_RULES: [(&str, &str); 8] = [
    (QWEN2, QWEN2_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    // GLM-4 and GLM-4.5+ (llama.cpp's CHATGLM4: Llama 3's rule, contractions spelled out).
    ("glm4", LLAMA3_SPLIT),
    ("chatglm-bpe", LLAMA3_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
];

/// The pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper, ImportError> {
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        None | Some("default") | Some("gpt-2") => Ok(byte_level.into()),
        Some("smollm") => {
            Ok(Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into())
        }
        Some(name) => {
            let supported = || {
                let mut names = vec!["smollm", "gpt-2", "default"];
                names.extend(SPLIT_RULES.map(|(n, _)| n));
                names.join(", ")
            };
            let (_, rule) = SPLIT_RULES
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| {
                    ImportError::Tokenizer(format!(
                    "tokenizer.ggml.pre = {name:?} is not supported yet (supported: {}); add its \
                     splitting rules in crates/gguf/src/tokenizer.rs",
                    supported()
                ))
                })?;
            let split = Split::new(
                SplitPattern::Regex((*rule).into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| ImportError::Tokenizer(format!("the {name} split rule: {e}")))?;
            let bytes = ByteLevel::new(false, false, false);
            Ok(Sequence::new(vec![split.into(), bytes.into()]).into())
        }
    }
}

/// Adds BOS/EOS around sequences when the metadata asks for it (`None` when it asks for neither).
pub(crate) fn template_processor(
    special: &SpecialTokens,
    tokens: &[String],
) -> Result<Option<PostProcessorWrapper>, ImportError> {
    if !special.add_bos && !special.add_eos {
        return Ok(None);
    }
    let named = |id: Option<u32>, what: &str| -> Result<(String, u32), ImportError> {
        let id = id.ok_or_else(|| {
            ImportError::Inconsistent(format!(
                "tokenizer.ggml.add_{what}_token is set but no {what} token id is given"
            ))
        })?;
        let token = tokens.get(id as usize).ok_or_else(|| {
            ImportError::Inconsistent(format!("{what} token id {id} is outside the vocabulary"))
        })?;
        Ok((token.clone(), id))
    };
    let bos = special
        .add_bos
        .then(|| named(special.bos, "bos"))
        .transpose()?;
    let eos = special
        .add_eos
        .then(|| named(special.eos, "eos"))
        .transpose()?;
    // Pieces as separate strings, so token text with spaces cannot split a piece.
    let wrap = |seq: &'static str, type_id: &str| {
        let mut pieces = Vec::new();
        pieces.extend(bos.iter().map(|(t, _)| format!("{t}:{type_id}")));
        pieces.push(seq.to_owned());
        pieces.extend(eos.iter().map(|(t, _)| format!("{t}:{type_id}")));
        pieces
    };
    let single = wrap("$A:0", "0");
    let mut pair = single.clone();
    pair.extend(wrap("$B:1", "1"));
    let specials: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
    fn as_str(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let processor = TemplateProcessing::builder()
        .try_single(as_str(&single))
        .and_then(|b| b.try_pair(as_str(&pair)))
        .map_err(ImportError::Tokenizer)?
        .special_tokens(specials)
        .build()
        .map_err(|e| ImportError::Tokenizer(e.to_string()))?;
    Ok(Some(processor.into()))
}
