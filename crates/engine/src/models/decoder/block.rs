//! One decoder layer: its mixer (softmax or linear attention), its MLP (dense, experts, or
//! both), its norms in the family's layout, and the extras some families add.

use mlx_rs::Array;

use super::family::Family;
use crate::{
    layers::gated_delta::GatedDeltaNet,
    layers::kimi_delta::KimiDelta,
    layers::kv_cache::{KvCache, LayerKv, SharedKv, StateCache},
    layers::laurel::Laurel,
    layers::mamba::Mamba,
    layers::mamba2::Mamba2,
    layers::mla::LatentAttention,
    layers::moe::SparseMoe,
    layers::parallel::Reduce,
    layers::short_conv::ShortConv,
    layers::{scalar_like, Attention, GatedMlp, Linear, Norm, Result, RmsNorm, RotaryAngles},
};

pub(super) enum Norms {
    PreNorm {
        input_layernorm: Norm,
        post_attention_layernorm: Norm,
    },
    Sandwich {
        input_layernorm: Norm,
        post_attention_layernorm: Norm,
        pre_feedforward_layernorm: Norm,
        post_feedforward_layernorm: Norm,
    },
    SandwichLaurel {
        input_layernorm: Norm,
        post_attention_layernorm: Norm,
        pre_feedforward_layernorm: Norm,
        post_feedforward_layernorm: Norm,
        laurel: Box<Laurel>,
    },
    PostNorm {
        post_attention_layernorm: Norm,
        post_feedforward_layernorm: Norm,
    },
    Parallel {
        input_layernorm: Norm,
    },
    Single {
        norm: Norm,
    },
}

/// A block's MLP.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mlp {
    Dense(GatedMlp),
    /// A mixer-only block's.
    None,
    /// Under its checkpoint name (`mlp`, Mixtral's `block_sparse_moe`).
    Moe(SparseMoe, &'static str),
    DenseAndMoe(Box<DenseAndMoe>),
}

/// [`MlpSpec::DenseAndMoe`](super::spec::MlpSpec::DenseAndMoe)'s layers.
pub(super) struct DenseAndMoe {
    pub(super) dense: GatedMlp,
    pub(super) post_dense: RmsNorm,
    pub(super) pre_experts: RmsNorm,
    pub(super) post_experts: RmsNorm,
    pub(super) moe: SparseMoe,
}

impl Mlp {
    /// The MLP's output for `x` (the block's input after the norm before the MLP, if any);
    /// `block_input` is that input un-normed.
    pub(super) fn forward(&self, x: &Array, block_input: &Array) -> Result<Array> {
        match self {
            Mlp::Dense(mlp) => mlp.forward(x),
            Mlp::None => Err(mlx_rs::error::Exception::custom("this block has no MLP")),
            Mlp::Moe(moe, _) => moe.forward(x),
            Mlp::DenseAndMoe(m) => {
                let dense = m.post_dense.forward(&m.dense.forward(x)?)?;
                let experts = m.pre_experts.forward(block_input)?;
                let experts = m.moe.forward_routed(block_input, &experts)?;
                dense.add(m.post_experts.forward(&experts)?)
            }
        }
    }

    /// The linear layers under their checkpoint names (relative to the block).
    pub(super) fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        fn dense(mlp: &mut GatedMlp) -> Vec<(String, &mut Linear)> {
            let named = mlp.linears_mut().into_iter();
            named.map(|(n, l)| (format!("mlp.{n}"), l)).collect()
        }
        match self {
            Mlp::Dense(mlp) => dense(mlp),
            Mlp::None => vec![],
            Mlp::Moe(moe, name) => {
                let named = moe.linears_mut().into_iter();
                named.map(|(n, l)| (format!("{name}.{n}"), l)).collect()
            }
            Mlp::DenseAndMoe(m) => {
                let mut out = dense(&mut m.dense);
                out.extend(m.moe.linears_mut());
                out
            }
        }
    }
}

/// A block's attention: over a KV cache, linear with a recurrent state, or over a cache of
/// latents.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mixer {
    SelfAttn(Attention),
    LinearAttn(GatedDeltaNet),
    KimiDelta(KimiDelta),
    Latent(LatentAttention),
    ShortConv(ShortConv),
    Mamba(Mamba),
    Mamba2(Mamba2),
    /// Attention and Mamba2 side by side (Falcon-H1).
    AttentionAndMamba(Box<(Attention, Mamba2)>),
    /// An MLP-only block's: its cache counts positions.
    None,
}

/// A recurrent layer's cache (every layer without keys and values has one).
fn state(cache: &mut KvCache) -> Result<&mut StateCache> {
    match cache {
        KvCache::State(state) => Ok(state),
        _ => Err(mlx_rs::error::Exception::custom(
            "a recurrent or MLP-only layer needs a state cache",
        )),
    }
}

pub(super) struct Block {
    pub(super) mixer: Mixer,
    pub(super) mlp: Mlp,
    pub(super) norms: Norms,
    /// Which of the forward pass's masks this layer takes (an index into
    /// [`Decoder::mask_sources`](super::model::Decoder::mask_sources)).
    pub(super) mask_kind: usize,
    /// The layer whose keys and values this one attends to, when not its own.
    pub(super) kv_from: Option<usize>,
    /// Later layers attend to this one's keys and values.
    pub(super) shares_kv: bool,
    /// Under tensor parallel: the sums of the attention's and the MLP's partial outputs.
    pub(super) tensor: Option<TensorReduce>,
}

/// A tensor-parallel block's two sums over the group (`layers/parallel.rs`).
pub(super) struct TensorReduce {
    pub(super) attention: Reduce,
    pub(super) mlp: Reduce,
}

impl Block {
    /// Its softmax attention (`None` for a linear-attention layer).
    pub(super) fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            Mixer::SelfAttn(a) => Some(a),
            _ => None,
        }
    }

    /// The block's output, and its keys and values when later layers share them.
    pub(super) fn forward(
        &self,
        family: &impl Family,
        x: &Array,
        kv: LayerKv,
        angles: Option<&RotaryAngles>,
    ) -> Result<(Array, Option<SharedKv>)> {
        let mut kept = None;
        let attn = |x: &Array| -> Result<(Array, Option<Array>)> {
            let one = match &self.mixer {
                Mixer::SelfAttn(a) => {
                    let shared = matches!(kv, LayerKv::Shared(..));
                    let (out, k) = a.forward(x, kv, angles, self.shares_kv)?;
                    kept = k;
                    match (&self.tensor, shared) {
                        (Some(t), false) => t.attention.apply(out),
                        _ => Ok(out),
                    }
                }
                Mixer::Latent(l) => kv.each_sequence(x, |x, cache, mask| l.forward(x, cache, mask)),
                Mixer::LinearAttn(l) => {
                    kv.each_sequence(x, |x, cache, _| l.forward(x, state(cache)?))
                }
                Mixer::KimiDelta(l) => {
                    kv.each_sequence(x, |x, cache, _| l.forward(x, state(cache)?))
                }
                Mixer::ShortConv(c) => {
                    kv.each_sequence(x, |x, cache, _| c.forward(x, state(cache)?))
                }
                Mixer::Mamba(m) => kv.each_sequence(x, |x, cache, _| m.forward(x, state(cache)?)),
                Mixer::Mamba2(m) => kv.each_sequence(x, |x, cache, _| m.forward(x, state(cache)?)),
                // Both mixers' outputs side by side along the features (each sequence's rows are
                // joined back as one array), split again below: `x + mamba + attn` in that order.
                Mixer::AttentionAndMamba(both) => {
                    let (attention, mamba) = &**both;
                    let joined = kv.each_sequence(x, |x, cache, mask| match cache {
                        KvCache::Pair(pair) => {
                            let [kv, recurrent] = &mut **pair;
                            let m = mamba.forward(x, state(recurrent)?)?;
                            let (a, _) =
                                attention.forward(x, LayerKv::Cache(kv, mask), None, false)?;
                            mlx_rs::ops::concatenate(&[m, a], -1)
                        }
                        _ => Err(mlx_rs::error::Exception::custom(
                            "attention beside a Mamba2 layer needs a pair of caches",
                        )),
                    })?;
                    let mut halves = joined.split_equal(2, -1)?.into_iter();
                    let mamba_out = halves.next().expect("two halves");
                    return Ok((mamba_out, halves.next()));
                }
                // The MLP is the block's sublayer (`Norms::Single`); the cache counts positions.
                Mixer::None => kv.each_sequence(x, |x, cache, _| {
                    state(cache)?.advance(x.dim(1));
                    Ok(x.clone())
                }),
            };
            Ok((one?, None))
        };
        Ok((self.sublayers(family, x, attn)?, kept))
    }

    /// The MLP's output (summed over the group under tensor parallel); `block_input`: `x`
    /// before its norm ([`Mlp::forward`]).
    pub(super) fn mlp_forward(&self, x: &Array, block_input: &Array) -> Result<Array> {
        let out = self.mlp.forward(x, block_input)?;
        match &self.tensor {
            Some(t) => t.mlp.apply(out),
            None => Ok(out),
        }
    }

    /// Attention and MLP with their norms and residuals, as the norm layout places them.
    pub(super) fn sublayers(
        &self,
        family: &impl Family,
        x: &Array,
        attn: impl FnOnce(&Array) -> Result<(Array, Option<Array>)>,
    ) -> Result<Array> {
        // A second mixer's output is added after the first's residual (`x + mamba + attn`,
        // Falcon-H1, pre-normed); no other layout has one.
        let one = |(out, second): (Array, Option<Array>)| match second {
            None => Ok(out),
            Some(_) => Err(mlx_rs::error::Exception::custom(
                "two mixers side by side need pre-norm blocks",
            )),
        };
        match &self.norms {
            Norms::PreNorm {
                input_layernorm,
                post_attention_layernorm,
            } => {
                let (r, second) = attn(&input_layernorm.forward(x)?)?;
                let h = family.residual(x, &r)?;
                let h = match second {
                    Some(s) => h.add(s)?,
                    None => h,
                };
                let r = self.mlp_forward(&post_attention_layernorm.forward(&h)?, &h)?;
                family.residual(&h, &r)
            }
            Norms::Sandwich {
                input_layernorm,
                post_attention_layernorm,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
            } => {
                let r = one(attn(&input_layernorm.forward(x)?)?)?;
                let h = family.residual(x, &post_attention_layernorm.forward(&r)?)?;
                let r = self.mlp_forward(&pre_feedforward_layernorm.forward(&h)?, &h)?;
                family.residual(&h, &post_feedforward_layernorm.forward(&r)?)
            }
            Norms::SandwichLaurel {
                input_layernorm,
                post_attention_layernorm,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
                laurel,
            } => {
                let normed = input_layernorm.forward(x)?;
                let beside = laurel.forward(&normed)?;
                let r = one(attn(&normed)?)?;
                let h = family.residual(x, &post_attention_layernorm.forward(&r)?)?;
                let h = h.add(&beside)?;
                let h = h.multiply(scalar_like(2f64.powf(-0.5) as f32, &h)?)?;
                let r = self.mlp_forward(&pre_feedforward_layernorm.forward(&h)?, &h)?;
                family.residual(&h, &post_feedforward_layernorm.forward(&r)?)
            }
            Norms::PostNorm {
                post_attention_layernorm,
                post_feedforward_layernorm,
            } => {
                let r = one(attn(x)?)?;
                let h = family.residual(x, &post_attention_layernorm.forward(&r)?)?;
                let r = self.mlp_forward(&h, &h)?;
                family.residual(&h, &post_feedforward_layernorm.forward(&r)?)
            }
            Norms::Parallel { input_layernorm } => {
                let h = input_layernorm.forward(x)?;
                let r = one(attn(&h)?)?.add(self.mlp_forward(&h, x)?)?;
                family.residual(&r, x)
            }
            Norms::Single { norm } => {
                let h = norm.forward(x)?;
                let r = match &self.mixer {
                    Mixer::None => {
                        one(attn(&h)?)?;
                        self.mlp_forward(&h, x)?
                    }
                    _ => one(attn(&h)?)?,
                };
                family.residual(x, &r)
            }
        }
    }
}
