//! The decoder as a [`LanguageModel`]: its parts, and what the runtime reads of it.

use std::rc::Rc;

use mlx_rs::Array;

use super::{
    block::{Block, Mixer, Norms},
    family::{Family, Llama},
    mtp::MtpHead,
};
use crate::{
    layers::distributed::Group,
    layers::kv_cache::{Caches, KvCache, StateCache},
    layers::mrope::MRope,
    layers::parallel::Parallel,
    layers::parallel::{self, Placement},
    layers::weights::checkpoint_name,
    layers::{Embedding, Linear, Norm, Result},
    models::model::{Facts, Input, LanguageModel, Stage, Tap},
};

pub struct Decoder<F: Family = Llama> {
    pub(super) family: F,
    pub(super) embed_tokens: Embedding,
    pub(super) layers: Vec<Block>,
    /// Per kind of layer (full attention, each sliding window, in order of first appearance):
    /// the first layer of that kind, whose cache gives the kind's mask (mlx-lm's `fa_idx` /
    /// `swa_idx`). All caches of one kind hold the same positions, so one mask serves them all.
    pub(super) mask_sources: Vec<usize>,
    pub(super) norm: Norm,
    pub(super) lm_head: Option<Linear>,
    pub(super) max_position_embeddings: Option<usize>,
    /// Multimodal RoPE in place of every layer's own (Qwen-VL): positions are given per token.
    pub(super) mrope: Option<MRope>,
    /// This rank's share of a model split over a group.
    pub(super) placement: Option<Placement>,
    /// The checkpoint index of `layers[0]` (a pipeline stage's first layer; else 0).
    pub(super) first_layer: usize,
    /// The checkpoint's layer count (more than `layers` holds on a pipeline's stage).
    pub(super) total_layers: usize,
    /// Parts the checkpoint names its own way, (checkpoint's, ours) ([`Weights::rename_parts`]):
    /// linear layers are named back for adapters.
    ///
    /// [`Weights::rename_parts`]: crate::layers::weights::Weights::rename_parts
    pub(super) renamed: Vec<(String, String)>,
    /// Under tensor parallel, the group an untied head's vocabulary is split over: each rank
    /// computes its rows' logits, gathered after.
    pub(super) vocab_split: Option<Rc<Group>>,
    /// The checkpoint's multi-token-prediction head, when it has one ([`Decoder::with_mtp`]).
    pub(super) mtp: Option<MtpHead>,
}

impl<F: Family> Decoder<F> {
    /// Layers with a KV cache of their own: all but the KV-shared ones, which follow them.
    pub(super) fn cache_count(&self) -> usize {
        self.layers.iter().filter(|l| l.kv_from.is_none()).count()
    }

    /// Head sizes of the layers whose KV cache `kv_bits` would quantize (full attention).
    pub(super) fn quantizable_kv_head_dims(&self) -> Vec<i32> {
        let own = self.layers.iter().filter(|l| l.kv_from.is_none());
        let attention = own.filter_map(|l| l.attention()).map(|a| &a.shape);
        attention
            .filter(|s| s.window.is_none() && s.chunk.is_none())
            .map(|s| s.head_dim)
            .collect()
    }

    /// Why `kv_bits` cannot quantize this model's KV cache whatever its head sizes.
    pub(super) fn kv_bits_refusal(&self) -> Option<String> {
        let sinks = |l: &Block| l.attention().is_some_and(|a| a.sinks.is_some());
        if self.layers.iter().any(sinks) {
            return Some(
                "this model's attention has sinks, which attention over a quantized KV cache \
                 does not take (mlx-lm refuses it too), so its KV cache cannot be quantized"
                    .to_owned(),
            );
        }
        if self
            .layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::Latent(_)))
        {
            return Some(
                "this model's attention caches compressed latents (multi-head latent \
                 attention), which mlx-lm attends to as plain arrays, so its KV cache cannot \
                 be quantized"
                    .to_owned(),
            );
        }
        // mlx-lm cannot run a quantized cache under KV-shared layers either (they would attend
        // to its quantized tuples as plain arrays).
        self.layers.iter().any(|l| l.kv_from.is_some()).then(|| {
            "this model's later layers attend to earlier layers' keys and values (Gemma 4's \
             KV sharing), which a quantized KV cache does not give"
                .to_owned()
        })
    }
}

impl<F: Family> LanguageModel for Decoder<F> {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward(&self, input: Input, caches: Caches) -> Result<Array> {
        self.head(&self.forward_pass(input, caches)?)
    }

    fn forward_with_hidden(
        &self,
        input: Input,
        caches: Caches,
        tap: &Tap,
    ) -> Result<(Array, Array)> {
        let layers = match tap {
            Tap::Final => &[][..],
            Tap::Layers(layers) => layers,
        };
        let (h, captured) = self.forward_capturing(input, caches, layers)?;
        let h = self.norm.forward(&h)?;
        let logits = self.project(&h)?;
        match tap {
            Tap::Final => Ok((logits, h)),
            Tap::Layers(_) => Ok((logits, mlx_rs::ops::concatenate(&captured, -1)?)),
        }
    }

    fn head_logits(&self, hidden: &Array) -> Result<Array> {
        self.project(hidden)
    }

    fn has_lm_head(&self) -> bool {
        self.lm_head.is_some()
    }

    fn mtp_depth(&self) -> usize {
        self.mtp.as_ref().map_or(0, MtpHead::depth)
    }

    fn mtp_caches(&self) -> Vec<KvCache> {
        self.mtp.as_ref().map_or_else(Vec::new, MtpHead::caches)
    }

    fn mtp_forward(
        &self,
        tokens: &Array,
        hidden: &Array,
        caches: &mut [KvCache],
    ) -> Result<(Array, Array)> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            mlx_rs::error::Exception::custom("this model has no multi-token-prediction head")
        })?;
        let embedded = self.embed_tokens.forward(tokens)?;
        let h = mtp.forward(&self.family, &embedded, hidden, caches)?;
        Ok((self.project(&h)?, h))
    }

    fn facts(&self) -> Facts {
        let (embedding_rows, hidden_size) = self.embed_tokens.table.dims();
        Facts {
            layers: self.layers.len(),
            hidden_size,
            embedding_rows,
            max_position_embeddings: self.max_position_embeddings,
            quantizable_kv_head_dims: self.quantizable_kv_head_dims(),
            kv_bits_refusal: self.kv_bits_refusal(),
            batching: self.batching(),
        }
    }

    fn make_caches(&self) -> Vec<KvCache> {
        let cache = |l: &Block| match &l.mixer {
            Mixer::SelfAttn(a) => match a.shape.chunk {
                Some(chunk) => KvCache::for_chunk(chunk),
                None => KvCache::for_window(a.shape.window),
            },
            Mixer::LinearAttn(_)
            | Mixer::KimiDelta(_)
            | Mixer::ShortConv(_)
            | Mixer::Mamba(_)
            | Mixer::Mamba2(_)
            | Mixer::None => KvCache::State(StateCache::default()),
            Mixer::Latent(a) if a.indexer.is_some() => KvCache::pair(),
            // Keys and values first: they give the offset and the mask.
            Mixer::AttentionAndMamba(both) => KvCache::Pair(Box::new([
                KvCache::for_window(both.0.shape.window),
                KvCache::State(StateCache::default()),
            ])),
            Mixer::Latent(_) => KvCache::for_window(None),
        };
        self.layers
            .iter()
            .filter(|l| l.kv_from.is_none())
            .map(cache)
            .collect()
    }

    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = vec![(
            "model.embed_tokens".to_owned(),
            &mut self.embed_tokens.table,
        )];
        for (i, l) in self.layers.iter_mut().enumerate() {
            let (name, attn) = match &mut l.mixer {
                Mixer::SelfAttn(a) => ("self_attn", a.linears_mut()),
                Mixer::LinearAttn(a) => ("linear_attn", a.linears_mut()),
                Mixer::Latent(a) => ("self_attn", a.linears_mut()),
                Mixer::KimiDelta(a) => ("self_attn", a.linears_mut()),
                Mixer::ShortConv(c) => ("conv", c.linears_mut()),
                Mixer::Mamba(m) => ("mamba", m.linears_mut()),
                Mixer::Mamba2(m) => ("mamba", m.linears_mut()),
                Mixer::AttentionAndMamba(both) => {
                    let (attention, mamba) = &mut **both;
                    let p = format!("model.layers.{}", i + self.first_layer);
                    let named = (attention.linears_mut().into_iter())
                        .map(|(n, l)| (format!("{p}.self_attn.{n}"), l));
                    out.extend(named.collect::<Vec<_>>());
                    ("mamba", mamba.linears_mut())
                }
                Mixer::None => ("", vec![]),
            };
            let p = format!("model.layers.{}", i + self.first_layer);
            out.extend(
                attn.into_iter()
                    .map(|(n, linear)| (format!("{p}.{name}.{n}"), linear)),
            );
            let mlp = l.mlp.linears_mut().into_iter();
            out.extend(mlp.map(|(n, linear)| (format!("{p}.{n}"), linear)));
            if let Norms::SandwichLaurel { laurel, .. } = &mut l.norms {
                let named = laurel.linears_mut().into_iter();
                out.extend(named.map(|(n, linear)| (format!("{p}.laurel.{n}"), linear)));
            }
        }
        out.extend(self.family.linears_mut());
        out.extend(self.lm_head.as_mut().map(|h| ("lm_head".to_owned(), h)));
        let renamed = &self.renamed;
        (out.into_iter())
            .map(|(name, linear)| (checkpoint_name(&name, renamed), linear))
            .collect()
    }

    fn stage(&self) -> Option<Stage<'_>> {
        let layers = self.first_layer..self.first_layer + self.layers.len();
        (self.placement.as_ref()).map(|placement| Stage {
            placement,
            layers,
            total_layers: self.total_layers,
        })
    }

    fn discard_stage_input(&self, tokens: &Array) -> Result<()> {
        let pipeline = self.placement.as_ref();
        let Some(p) = pipeline.filter(|p| p.mode == Parallel::Pipeline) else {
            return Ok(());
        };
        let like = self.embed(&tokens.reshape(&[1, -1])?)?;
        let like = self.family.scale_embeddings(like)?;
        parallel::receive(p, like)?.eval()
    }
}
