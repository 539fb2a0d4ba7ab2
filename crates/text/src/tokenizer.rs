//! `ModelTokenizer`: a model's tokenizer with everything around it that generation needs
//! (special tokens, end-of-sequence ids, the chat template).

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::chat_template::{
    ChatTemplate, ChatTemplateError, ChatTemplateSource, RenderOptions, SpecialTokens,
};
use crate::detokenizer::StreamingDetokenizer;
use crate::messages::Message;
use crate::model_files::ModelFiles;

/// Failures of loading or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The model directory has no tokenizer.json.
    #[error("no tokenizer.json in {0}; the model directory needs a Hugging Face fast tokenizer (convert slow tokenizers with transformers first)")]
    Missing(PathBuf),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A JSON side file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    InvalidJson {
        /// The file.
        path: PathBuf,
        /// Where and why.
        source: serde_json::Error,
    },
    /// The tokenizers crate refused the tokenizer or an input.
    #[error("tokenizer error: {0}")]
    Tokenizers(#[source] tokenizers::Error),
    /// A prompt was asked for from messages, but the model has no chat template.
    #[error(
        "the model has no chat template; load it with chat_template_override or send plain text"
    )]
    NoChatTemplate,
    /// The chat template failed.
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
}

/// A prompt rendered from messages, and its token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The text the chat template produced.
    pub text: String,
    /// Its tokens, encoded without adding special tokens (the template wrote them).
    pub ids: Vec<u32>,
}

/// A model's tokenizer (tokenizer.json) with its special tokens, end-of-sequence ids and chat
/// template. Cheap to share (`Send + Sync`); the tokenizer itself sits behind an `Arc`.
#[derive(Debug)]
pub struct ModelTokenizer {
    tokenizer: Arc<Tokenizer>,
    special_ids: Arc<HashSet<u32>>,
    eos_ids: BTreeSet<u32>,
    special: SpecialTokens,
    add_bos_token: Option<bool>,
    chat_template: Option<ChatTemplate>,
    chat_template_source: ChatTemplateSource,
}

impl ModelTokenizer {
    /// Loads `tokenizer.json` and the side files of a Hugging Face model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TokenizerError::Missing(dir.to_path_buf()));
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(TokenizerError::Tokenizers)?;
        let files = ModelFiles::read(dir)?;
        Self::from_parts(tokenizer, files)
    }

    /// Builds from a tokenizer and what the side files say (a GGUF importer fills
    /// [`ModelFiles`] from metadata).
    pub fn from_parts(tokenizer: Tokenizer, files: ModelFiles) -> Result<Self, TokenizerError> {
        let special_ids: HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let mut eos_ids = files.eos_token_ids;
        if let Some(id) = files
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
        {
            eos_ids.insert(id);
        }
        let special = SpecialTokens {
            bos_token: files.bos_token,
            eos_token: files.eos_token,
            pad_token: files.pad_token,
            unk_token: files.unk_token,
        };
        let (chat_template, chat_template_source) = match files.chat_templates {
            Some((templates, source)) => (
                Some(ChatTemplate::with_names(templates, special.clone())?),
                source,
            ),
            None => (None, ChatTemplateSource::None),
        };
        Ok(ModelTokenizer {
            tokenizer: Arc::new(tokenizer),
            special_ids: Arc::new(special_ids),
            eos_ids,
            special,
            add_bos_token: files.add_bos_token,
            chat_template,
            chat_template_source,
        })
    }

    /// Replaces the chat template (`load`'s `chat_template_override`, or a GGUF's template).
    pub fn set_chat_template(
        &mut self,
        source: &str,
        origin: ChatTemplateSource,
    ) -> Result<(), ChatTemplateError> {
        self.chat_template = Some(ChatTemplate::new(source, self.special.clone())?);
        self.chat_template_source = origin;
        Ok(())
    }

    /// Token ids of `text`. `add_special_tokens` runs the tokenizer's post-processor (which
    /// adds BOS for Llama-style models); pass false for text that already holds them.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(TokenizerError::Tokenizers)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, in one go.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(TokenizerError::Tokenizers)
    }

    /// The vocabulary entry of `id` (`Ġthe`, `▁the`, `<|im_end|>`), not decoded text.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The id of a vocabulary entry.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Ids that end a generation: config.json and generation_config.json `eos_token_id`, and
    /// tokenizer_config.json's `eos_token`.
    pub fn eos_token_ids(&self) -> &BTreeSet<u32> {
        &self.eos_ids
    }

    /// Whether `id` ends a generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The BOS token text, if the model has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.special.bos_token.as_deref()
    }

    /// The special token texts of tokenizer_config.json.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// `add_bos_token` of tokenizer_config.json, as written (the post-processor of
    /// tokenizer.json is what `encode` follows).
    pub fn add_bos_token(&self) -> Option<bool> {
        self.add_bos_token
    }

    /// Ids of special tokens (skipped when decoding for the user).
    pub fn special_token_ids(&self) -> &HashSet<u32> {
        &self.special_ids
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Where the chat template came from.
    pub fn chat_template_source(&self) -> ChatTemplateSource {
        self.chat_template_source
    }

    /// The underlying tokenizers-crate tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Renders `messages` with the chat template and encodes the result the way
    /// `apply_chat_template(tokenize=True)` does: without adding special tokens, because the
    /// template already wrote BOS where the model wants it.
    pub fn render_and_encode(
        &self,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<RenderedPrompt, TokenizerError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let text = template.render(messages, options)?;
        let ids = self.encode(&text, false)?;
        Ok(RenderedPrompt { text, ids })
    }

    /// A streaming detokenizer for one generation.
    pub fn detokenizer(&self) -> StreamingDetokenizer {
        StreamingDetokenizer::new(self.tokenizer.clone(), self.special_ids.clone())
    }
}
