//! A checkpoint's own multi-token-prediction head (Qwen3.5's and Qwen3-Next's `mtp.*`), run as
//! a drafter for speculative decoding (mlx-vlm's `qwen3_5_mtp` drafter). At position `i` it reads
//! the model's final hidden state there (after the final norm) and the embedding of token
//! `i + 1`, each RMS-normed, joined and projected back to the hidden size (`fc`); then its own
//! full-attention decoder layers (with their own KV caches) and norm; the model's head gives
//! its guess for token `i + 2`. Its own output can take the model's hidden state's place, so it
//! chains to draft several tokens.

use mlx_rs::{ops, Array};

use super::{
    block::Block,
    family::Family,
    load::{load_block, norm},
    model::Decoder,
    spec::LayerSpec,
};
use crate::{
    error::{EngineError, LoadErrorKind},
    layers::kv_cache::{Caches, KvCache},
    layers::weights::Weights,
    layers::{Linear, Result, RmsNorm},
};

pub(super) struct MtpHead {
    fc: Linear,
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    layers: Vec<Block>,
    norm: RmsNorm,
}

impl MtpHead {
    /// The head under `mtp.` (`fc`, `pre_fc_norm_*`, `layers.N`, `norm`), its layers built as
    /// `layer` (the model's full-attention layer).
    fn load(
        mut weights: Weights,
        count: usize,
        layer: &LayerSpec,
        family: &impl Family,
    ) -> std::result::Result<Self, EngineError> {
        let eps = layer.rms_norm_eps;
        let fc = weights.linear("fc")?;
        let mut norm = |name: &str| norm(&mut weights, name, eps, family);
        let (pre_fc_norm_embedding, pre_fc_norm_hidden, last_norm) = (
            norm("pre_fc_norm_embedding")?,
            norm("pre_fc_norm_hidden")?,
            norm("norm")?,
        );
        let hidden = pre_fc_norm_hidden.weight.dim(0);
        let (fc_out, fc_in) = fc.dims();
        if (fc_out, fc_in) != (hidden, 2 * hidden) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "mtp.fc takes {fc_in} features to {fc_out}, not twice the hidden size \
                     ({hidden}) to it: the multi-token-prediction head does not belong to this \
                     model"
                ),
            ));
        }
        let layers = (0..count)
            .map(|i| {
                load_block(
                    &mut weights,
                    &format!("layers.{i}"),
                    layer.clone(),
                    family,
                    0,
                )
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(Self {
            fc,
            pre_fc_norm_embedding,
            pre_fc_norm_hidden,
            layers,
            norm: last_norm,
        })
    }
}

impl<F: Family> Decoder<F> {
    /// Loads the head from `weights` (the checkpoint's `mtp.*`, prefix taken off) when it has
    /// `count > 0` layers, built as the model's last full-attention layer.
    pub fn with_mtp(
        mut self,
        weights: Weights,
        count: usize,
        layer: &LayerSpec,
    ) -> std::result::Result<Self, EngineError> {
        // A rank of a split model holds part of the hidden state: no head.
        if count > 0 && weights.contains("fc.weight") && self.placement.is_none() {
            self.mtp = Some(MtpHead::load(weights, count, layer, &self.family)?);
        }
        Ok(self)
    }

    pub(super) fn mtp_depth(&self) -> usize {
        self.mtp.as_ref().map_or(0, |m| m.layers.len())
    }

    pub(super) fn mtp_caches(&self) -> Vec<KvCache> {
        let count = self.mtp.as_ref().map_or(0, |m| m.layers.len());
        (0..count).map(|_| KvCache::default()).collect()
    }

    /// The head over `tokens` `(1, T)` beside the hidden states `(1, T, H)` before them:
    /// its logits `(1, T, V)` and output hidden states `(1, T, H)`.
    pub(super) fn mtp_forward(
        &self,
        tokens: &Array,
        hidden: &Array,
        caches: &mut [KvCache],
    ) -> Result<(Array, Array)> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            mlx_rs::error::Exception::custom("this model has no multi-token-prediction head")
        })?;
        let embedded = self.embed_tokens.forward(tokens)?;
        let joined = ops::concatenate(
            &[
                mtp.pre_fc_norm_embedding.forward(&embedded)?,
                mtp.pre_fc_norm_hidden.forward(hidden)?,
            ],
            -1,
        )?;
        let mut h = mtp.fc.forward(&joined)?;
        let mut caches = Caches::One(caches);
        let masks = caches.masks(&[0], h.dim(1))?;
        for (i, layer) in mtp.layers.iter().enumerate() {
            let kv = caches.layer(i, 0, &masks)?;
            h = layer.forward(&self.family, &h, kv, None)?.0;
        }
        let h = mtp.norm.forward(&h)?;
        Ok((self.project(&h)?, h))
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, Array};
    use serde_json::Value;

    use crate::{
        layers::kv_cache::Caches,
        layers::weights::Weights,
        models::{build, Input},
    };

    fn ids(a: &Array) -> Vec<u32> {
        let a = ops::indexing::argmax_axis(a, -1, None).unwrap();
        a.flatten(None, None).unwrap().as_slice::<u32>().to_vec()
    }

    /// The head of the tiny-qwen3-5 fixture (made with mlx-vlm's `qwen3_5_mtp` drafter class)
    /// guesses what mlx-vlm's drafter guesses beside mlx-lm's model (`mtp_reference.json`,
    /// written with the fixture): at every position of the prompt shifted by the first token
    /// taken, and three guesses chained on its own hidden states.
    #[test]
    fn guesses_what_mlx_vlms_drafter_guesses() {
        let _mlx = fixtures::mlx_test_lock();
        let Some(dir) = fixtures::vision_fixture("tiny-qwen3-5") else {
            return;
        };
        let read = |name: &str| -> Value {
            let text = std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}: rebuild the fixture (delete it)"));
            serde_json::from_str(&text).unwrap()
        };
        let (config, reference) = (read("config.json"), read("mtp_reference.json"));
        let model = build(&config, Weights::load_dir(&dir, &config).unwrap()).unwrap();
        assert_eq!(model.mtp_depth(), 1);
        let list = |key: &str| -> Vec<u32> {
            let values = reference[key].as_array().unwrap();
            values.iter().map(|v| v.as_u64().unwrap() as u32).collect()
        };
        let prompt = list("prompt");
        let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
        let mut caches = model.make_caches();
        let (logits, hidden) = (model)
            .forward_with_hidden(Input::tokens(&input), Caches::One(&mut caches))
            .unwrap();
        let first = *ids(&logits).last().unwrap();
        assert_eq!(first, reference["first"].as_u64().unwrap() as u32);

        let shifted = [&prompt[1..], &[first]].concat();
        let shifted = Array::from_slice(&shifted, &[1, prompt.len() as i32]);
        let mut head = model.mtp_caches();
        let (guessed, own) = model.mtp_forward(&shifted, &hidden, &mut head).unwrap();
        assert_eq!(ids(&guessed), list("guesses"));

        let last = Array::from_int(own.dim(1) - 1);
        let mut token = Array::from_slice(&[*list("guesses").last().unwrap()], &[1, 1]);
        let mut h = own.take_axis(&last, 1).unwrap().expand_dims(1).unwrap();
        let mut chained = Vec::new();
        for _ in 0..list("chained").len() {
            let (logits, next) = model.mtp_forward(&token, &h, &mut head).unwrap();
            chained.push(ids(&logits)[0]);
            token = Array::from_slice(&[chained[chained.len() - 1]], &[1, 1]);
            h = next;
        }
        assert_eq!(chained, list("chained"));
    }
}
