//! A model made resident by `load`, and the view of it generations read.

use std::{cell::RefCell, sync::Arc};

use text::ModelTokenizer;

use crate::{
    layers::lora::AdapterSwitch,
    models::{BlockKind, DFlash, Eagle3, LanguageModel},
    runtime::footprint::Footprint,
    runtime::image_features::ImageFeatures,
    runtime::prompt_cache::PromptCache,
    runtime::request::{DraftKind, LoadRequest, ModelInfo},
    vision::VisionModel,
};

/// What drafts beside a model for speculative decoding (`load`'s `draft_model`).
pub(crate) enum Draft {
    /// A smaller model of the same vocabulary, decoding ahead of it.
    Model(Box<dyn LanguageModel>),
    /// A block drafter (DFlash, DFlash2, DSpark), reading the model's hidden states.
    Block(Box<DFlash>),
    /// An EAGLE-3 drafter, reading the model's hidden states and chaining its guesses.
    Eagle3(Box<Eagle3>),
}

impl Draft {
    pub(crate) fn kind(&self) -> DraftKind {
        match self {
            Draft::Model(_) => DraftKind::Model,
            Draft::Eagle3(_) => DraftKind::Eagle3,
            Draft::Block(drafter) => match drafter.kind {
                BlockKind::Dflash => DraftKind::Dflash,
                BlockKind::Dflash2 => DraftKind::Dflash2,
                BlockKind::Dspark => DraftKind::Dspark,
            },
        }
    }
}

/// A model made resident by `load`.
pub(crate) struct Resident {
    pub(crate) info: ModelInfo,
    pub(crate) model: Box<dyn LanguageModel>,
    /// The vision side of a vision-language model.
    pub(crate) vision: Option<Box<dyn VisionModel>>,
    pub(crate) tokenizer: Arc<ModelTokenizer>,
    /// The load that made it (without the token): which options it runs with.
    pub(crate) load: LoadRequest,
    /// The switch of the attached adapter, if any.
    pub(crate) adapter: Option<AdapterSwitch>,
    /// The drafter for speculative decoding, if one was loaded with it.
    pub(crate) draft: Option<Draft>,
    /// What it costs in memory.
    pub(crate) footprint: Footprint,
    /// Recent generations' KV caches, for the next prompts that start the same way.
    pub(crate) prompt_cache: PromptCache,
    /// A vision model's encoder outputs, kept by image (emptied with the prompt cache).
    pub(crate) image_features: RefCell<ImageFeatures>,
    /// The tokenizer as the grammar engine reads it, made by the first constrained request.
    pub(crate) vocabulary: Option<constrain::Vocabulary>,
}

/// What generating with a resident reads, borrowed apart from what it changes (its prompt
/// cache and grammar vocabulary): generations in flight read it while another is prepared.
#[derive(Clone, Copy)]
pub(crate) struct View<'r> {
    pub model: &'r dyn LanguageModel,
    pub draft: Option<&'r Draft>,
    pub vision: Option<&'r dyn VisionModel>,
    pub tokenizer: &'r ModelTokenizer,
    pub info: &'r ModelInfo,
    pub adapter: Option<&'r AdapterSwitch>,
    pub footprint: &'r Footprint,
    pub image_features: &'r RefCell<ImageFeatures>,
}

impl Resident {
    /// Bytes of its kept conversations' KV caches and its kept image features.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.prompt_cache.bytes() + self.image_features.borrow().bytes()
    }

    /// Drops its kept conversations' KV caches and its kept image features.
    pub(crate) fn forget_caches(&mut self) {
        self.prompt_cache.clear();
        self.image_features.get_mut().clear();
    }

    pub(crate) fn split(
        &mut self,
    ) -> (
        View<'_>,
        &mut PromptCache,
        &mut Option<constrain::Vocabulary>,
    ) {
        let view = View {
            model: self.model.as_ref(),
            draft: self.draft.as_ref(),
            vision: self.vision.as_deref(),
            tokenizer: &self.tokenizer,
            info: &self.info,
            adapter: self.adapter.as_ref(),
            footprint: &self.footprint,
            image_features: &self.image_features,
        };
        (view, &mut self.prompt_cache, &mut self.vocabulary)
    }
}
