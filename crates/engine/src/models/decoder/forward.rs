//! The one forward pass, over any kind of cache set (`layers/kv_cache/pass.rs`).

use mlx_rs::Array;

use super::{
    block::{Block, Mixer},
    family::Family,
    model::Decoder,
};
use crate::{
    layers::kv_cache::{Caches, LayerKv, PassMasks, SharedKv},
    layers::parallel,
    layers::parallel::Parallel,
    layers::Result,
    models::model::{Batching, Input},
};

impl<F: Family> Decoder<F> {
    /// How batches of this model run: row by row (or in segments) where no layer needs more
    /// than its own sequence's caches (not with multimodal RoPE's positions per token, layers
    /// that share another layer's keys, or a split over a group); over a padded cache where,
    /// besides, every layer is softmax attention without a temperature (whose caches are then
    /// the full-attention ones a padded cache takes).
    pub(super) fn batching(&self) -> Batching {
        let rows = self.mrope.is_none()
            && self.placement.is_none()
            && self.layers.iter().all(|l| l.kv_from.is_none());
        let plain =
            |l: &Block| matches!(&l.mixer, Mixer::SelfAttn(a) if a.shape.temperature.is_none());
        Batching {
            rows,
            padded: rows && self.layers.iter().all(plain),
        }
    }

    /// The final norm, the head (or the tied embedding) and the family's logit processing.
    pub(super) fn head(&self, h: &Array) -> Result<Array> {
        self.project(&self.norm.forward(h)?)
    }

    /// The head (or the tied embedding) over normed hidden states, and the family's logit
    /// processing.
    pub(super) fn project(&self, h: &Array) -> Result<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(h)?,
            None => self.embed_tokens.as_linear(h)?,
        };
        let logits = match &self.vocab_split {
            // Each rank's rows of the vocabulary, gathered in rank order along the last axis.
            Some(group) => group
                .all_gather(&logits.transpose_axes(&[2, 0, 1])?)?
                .transpose_axes(&[1, 2, 0])?,
            None => logits,
        };
        self.family.logits(logits)
    }

    /// The forward pass: embed (or take the input embeddings), the family's scaling and
    /// per-layer inputs, one mask per kind of layer, the layers (each over its view of
    /// `caches`), the head. Embeddings, projections, MLPs and the head run over every row and
    /// position of the pass at once; how each sequence's positions are rotated, stored and
    /// attended is `caches`'s kind's (`layers/kv_cache/pass.rs`). Returns the hidden states
    /// before the final norm, of the positions the head reads.
    pub(super) fn forward_pass(&self, input: Input, caches: Caches) -> Result<Array> {
        Ok(self.forward_capturing(input, caches, &[])?.0)
    }

    /// [`Self::forward_pass`], with the outputs of the layers `capture` (indices in the whole
    /// model, in that order) of one sequence, every position `(1, L, hidden)`.
    pub(super) fn forward_capturing(
        &self,
        input: Input,
        mut caches: Caches,
        capture: &[usize],
    ) -> Result<(Array, Vec<Array>)> {
        if !capture.is_empty() && (self.placement.is_some() || caches.is_batch()) {
            return Err(mlx_rs::error::Exception::custom(
                "hidden states of inner layers are taken from one sequence on one rank",
            ));
        }
        caches.check(self.cache_count())?;
        // Refused before any cache is touched (a padded step moves every row's offset).
        let batching = self.batching();
        if caches.is_batch() && !batching.rows {
            return Err(mlx_rs::error::Exception::custom(
                "this model runs one sequence at a time",
            ));
        }
        if matches!(caches, Caches::Padded(_)) && !batching.padded {
            return Err(mlx_rs::error::Exception::custom(
                "this model's batches attend row by row",
            ));
        }
        let h = match (input.embeddings, input.tokens) {
            (Some(h), _) => h,
            (None, Some(tokens)) => self.embed_tokens.forward(tokens)?,
            (None, None) => {
                return Err(mlx_rs::error::Exception::custom(
                    "a forward pass with no input",
                ))
            }
        };
        let h = self.family.scale_embeddings(h)?;
        let per_layer = self.family.per_layer_inputs(input.tokens, &h)?;
        let n = h.dim(1);
        let mut h = self.family.widen(h)?;
        let masks = caches.masks(&self.mask_sources, n)?;
        // M-RoPE's angles, once per pass (mlx-vlm's `position_embeddings`).
        let angles = match (&self.mrope, input.positions) {
            (Some(m), Some(p)) => Some(m.angles(p, h.dtype())?),
            (Some(m), None) => {
                let start = caches.offset();
                let row = mlx_rs::ops::arange::<_, i32>(start, start + n, 1)?;
                let p = mlx_rs::ops::broadcast_to(&row.reshape(&[1, n])?, &[3, n])?;
                Some(m.angles(&p, h.dtype())?)
            }
            (None, Some(_)) => {
                return Err(mlx_rs::error::Exception::custom(
                    "explicit positions given to a model without multimodal RoPE",
                ))
            }
            (None, None) => None,
        };
        let pipeline = (self.placement.as_ref()).filter(|p| p.mode == Parallel::Pipeline);
        if let Some(p) = pipeline {
            h = parallel::receive(p, h)?;
        }
        // Keys and values of this pass that later layers share (mlx-lm's `intermediates`).
        let mut kept: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        let mut captured: Vec<Option<Array>> = vec![None; capture.len()];
        for (i, layer) in self.layers.iter().enumerate() {
            let kv = match layer.kv_from {
                Some(src) => {
                    let shared = kept[src].as_ref().ok_or_else(|| {
                        mlx_rs::error::Exception::custom(format!("layer {src} kept no keys"))
                    })?;
                    let PassMasks::Sequences(m) = &masks else {
                        return Err(mlx_rs::error::Exception::custom(
                            "KV-shared layers run one sequence at a time",
                        ));
                    };
                    LayerKv::Shared(shared, &m[0][layer.mask_kind])
                }
                None => caches.layer(i, layer.mask_kind, &masks)?,
            };
            let layer_input = match &per_layer {
                Some(p) => Some(p.take_axis(Array::from_int(i as i32), 2)?),
                None => None,
            };
            // A KV-shared layer rotates its queries by its own RoPE (at the sharing layer's
            // offset), never by a pass's M-RoPE angles.
            let angles = angles.as_ref().filter(|_| layer.kv_from.is_none());
            let (mut kv, mut shared) = (Some(kv), None);
            let mut block = |x: &Array| {
                let kv = kv.take().ok_or_else(|| {
                    mlx_rs::error::Exception::custom("a layer's block runs once per pass")
                })?;
                let (out, kept) = layer.forward(&self.family, x, kv, angles)?;
                shared = kept;
                Ok(out)
            };
            let index = self.first_layer + i;
            h = (self.family).layer(index, &h, layer_input.as_ref(), &mut block)?;
            if shared.is_some() {
                kept[i] = shared;
            }
            if let Some(rows) = input.deepstack.get(i) {
                h = h.add(rows)?;
            }
            for (slot, _) in (captured.iter_mut().zip(capture)).filter(|(_, &c)| c == i) {
                // A family carrying several hidden states (Gemma 3n's streams, 4-D) has no
                // `(B, L, hidden)` to give.
                if h.ndim() != 3 {
                    return Err(mlx_rs::error::Exception::custom(
                        "this model's layers carry several hidden states; a drafter cannot \
                         read them",
                    ));
                }
                *slot = Some(h.clone());
            }
        }
        let captured = captured.into_iter().zip(capture).map(|(h, i)| {
            h.ok_or_else(|| mlx_rs::error::Exception::custom(format!("the model has no layer {i}")))
        });
        let captured = captured.collect::<Result<Vec<_>>>()?;
        if let Some(p) = pipeline {
            h = parallel::hand_on(p, h)?;
        }
        let h = self.family.narrow(h)?;
        Ok((caches.head_positions(h)?, captured))
    }
}
