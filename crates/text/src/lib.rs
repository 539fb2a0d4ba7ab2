//! The text side of generation, without MLX: the model's tokenizer and chat template, the
//! streaming detokenizer that turns generated ids into text deltas, and stop sequences.
//! Everything here is `Send + Sync`, so `tokenize` can be answered while a generation runs.

mod chat_template;
mod detokenizer;
mod messages;
mod model_files;
pub mod python_json;
mod stop;
mod template_functions;
mod tokenizer;

pub use chat_template::{
    ChatTemplate, ChatTemplateError, ChatTemplateSource, RenderOptions, SpecialTokens,
};
pub use detokenizer::StreamingDetokenizer;
pub use messages::{prepend_system_prompt, Message, MessageContent};
pub use model_files::{ModelFiles, NamedTemplates};
pub use stop::{StopHit, StopMatcher, StopOutcome};
pub use tokenizer::{ModelTokenizer, RenderedPrompt, TokenizerError};
pub use tokenizers::Tokenizer;
