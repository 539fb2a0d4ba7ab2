//! Building a decoder from a checkpoint: each layer's tensors by name, shape checks before
//! any computation, KV sharing, and the checkpoint quirks every family shares.

use super::{
    block::{Block, DenseAndMoe, Mixer, Mlp, Norms},
    family::{Family, Llama},
    model::Decoder,
    mtp::MtpHead,
    parallel::{shard_block, stage},
    spec::{AttentionKind, CommonArgs, DecoderSpec, LayerSpec, LlamaArgs, MlpSpec, NormLayout},
};
use crate::{
    error::{EngineError, LoadErrorKind},
    layers::gated_delta::GatedDeltaNet,
    layers::kimi_delta::KimiDelta,
    layers::laurel::Laurel,
    layers::mamba::Mamba,
    layers::mamba2::Mamba2,
    layers::mla::{Indexer, LatentAttention, LatentQuery, MlaSpec, MultiLinear},
    layers::moe::SparseMoe,
    layers::mrope::MRope,
    layers::parallel::Parallel,
    layers::short_conv::ShortConv,
    layers::weights::Weights,
    layers::{Attention, GateUp, GatedMlp, Linear, Norm, QkNorm, QkNormOver, Qkv, RmsNorm},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// Drops the checkpoint's unused tensors, then builds `common.num_hidden_layers` copies of
/// `layer`: the whole load of a Llama-like family whose layers are all alike.
pub fn load_uniform(
    mut weights: Weights,
    common: &CommonArgs,
    layer: LayerSpec,
    tie_word_embeddings: bool,
    max_position_embeddings: Option<usize>,
) -> LoadResult<Decoder> {
    sanitize(&mut weights, tie_word_embeddings);
    let spec = DecoderSpec::uniform(
        layer,
        common.num_hidden_layers,
        tie_word_embeddings,
        max_position_embeddings,
    );
    Decoder::load(weights, spec, Llama)
}

/// Drops the checkpoint's unused tensors, then builds `layers` (one spec per layer, final norm
/// as `common`'s): the whole load of a Llama-like family whose layers differ (windows, RoPE).
pub fn load_layers(
    mut weights: Weights,
    common: &CommonArgs,
    layers: Vec<LayerSpec>,
    tie_word_embeddings: bool,
    max_position_embeddings: Option<usize>,
) -> LoadResult<Decoder> {
    sanitize(&mut weights, tie_word_embeddings);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: common.rms_norm_eps,
        tie_word_embeddings,
        max_position_embeddings,
    };
    Decoder::load(weights, spec, Llama)
}

impl LlamaArgs {
    /// [`load_uniform`] with every layer `layer`.
    pub fn load_uniform(&self, weights: Weights, layer: LayerSpec) -> LoadResult<Decoder> {
        let (tie, max_pos) = (self.tie_word_embeddings, self.max_position_embeddings);
        load_uniform(weights, &self.common, layer, tie, max_pos)
    }
}

impl<F: Family> Decoder<F> {
    /// Builds the model from Hugging Face tensor names (`model.layers.N.self_attn.q_proj`, ...).
    pub fn load(mut weights: Weights, spec: DecoderSpec, mut family: F) -> LoadResult<Self> {
        let placement = weights.take_placement();
        let renamed = weights.renamed_parts().to_vec();
        let per_layer_inputs = family.has_per_layer_inputs();
        let owned = stage(placement.as_ref(), &spec.layers, per_layer_inputs)?;
        let total_layers = spec.layers.len();
        // Layers are of one kind when their caches give the same masks: by window and chunk;
        // linear-attention and convolution layers are a kind of their own (no mask).
        let kind = |l: &LayerSpec| match l.attention {
            AttentionKind::Softmax { .. } => Some((l.shape.window, l.shape.chunk)),
            AttentionKind::SoftmaxAndMamba2(_) => Some((l.shape.window, l.shape.chunk)),
            AttentionKind::GatedDelta(_)
            | AttentionKind::KimiDelta(_)
            | AttentionKind::Mamba(_)
            | AttentionKind::ShortConv(_)
            | AttentionKind::Mamba2(_)
            | AttentionKind::None => None,
            AttentionKind::Latent(_) => Some((None, None)),
        };
        let own_specs = spec.layers[owned.clone()].iter();
        let (mask_sources, layer_kinds) = mask_kinds(own_specs.map(kind));
        let embed_tokens = weights.embedding("model.embed_tokens")?;
        let hidden = embed_tokens.table.dims().1;
        let mut layers = Vec::with_capacity(owned.len());
        let mut kinds = layer_kinds.into_iter();
        for (i, layer) in spec.layers.into_iter().enumerate() {
            let p = format!("model.layers.{i}");
            if !owned.contains(&i) {
                weights.drop_prefixed(&format!("{p}."));
                continue;
            }
            let kind = kinds.next().expect("one kind per owned layer");
            family.load_layer(&mut weights, i, &p)?;
            let mut block = load_block(&mut weights, &p, layer, &family, kind)?;
            check_shapes(&block, &p, hidden)?;
            if let Some(pl) = placement.as_ref().filter(|pl| pl.mode == Parallel::Tensor) {
                shard_block(&mut block, &pl.group, &p, per_layer_inputs)?;
            }
            layers.push(block);
        }
        check_kv_sharing(&mut layers)?;
        let mut model = Self {
            embed_tokens,
            layers,
            mask_sources,
            norm: block_norm(&mut weights, "model.norm", spec.rms_norm_eps, &family)?,
            lm_head: match spec.tie_word_embeddings {
                true => None,
                false => Some(weights.linear("lm_head")?),
            },
            vocab_split: None,
            max_position_embeddings: spec.max_position_embeddings,
            family,
            mrope: None,
            placement,
            renamed,
            first_layer: owned.start,
            total_layers,
            mtp: None,
        };
        model.split_vocabulary()?;
        Ok(model)
    }

    /// Every layer rotates by `mrope` at explicit positions
    /// ([`Input::positions`](crate::models::Input); without them, at the cache offset on all
    /// three rows) instead of by its own RoPE.
    pub fn with_mrope(mut self, mrope: MRope) -> Self {
        self.mrope = Some(mrope);
        self
    }

    /// Loads the checkpoint's multi-token-prediction head ([`MtpHead`]: `mtp.fc`,
    /// `mtp.pre_fc_norm_*`, `mtp.layers.N`, `mtp.norm`, prefix taken off) when it has
    /// `count > 0` layers, each built as `layer` (the model's full-attention layer).
    pub fn with_mtp(
        mut self,
        mut weights: Weights,
        count: usize,
        layer: &LayerSpec,
    ) -> LoadResult<Self> {
        // A rank of a split model holds part of the hidden state: no head.
        if count == 0 || !weights.contains("fc.weight") || self.placement.is_some() {
            return Ok(self);
        }
        let (eps, family) = (layer.rms_norm_eps, &self.family);
        let mut norm = |name: &str| norm(&mut weights, name, eps, family);
        let (pre_fc_norm_embedding, pre_fc_norm_hidden, last) = (
            norm("pre_fc_norm_embedding")?,
            norm("pre_fc_norm_hidden")?,
            norm("norm")?,
        );
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
            .collect::<LoadResult<_>>()?;
        let head = MtpHead {
            fc: weights.linear("fc")?,
            pre_fc_norm_embedding,
            pre_fc_norm_hidden,
            layers,
            norm: last,
        };
        head.check()?;
        self.mtp = Some(head);
        Ok(self)
    }
}

/// Checkpoint quirks every family shares: precomputed rotary tables (`inv_freq`) the model
/// recomputes, and a stored head that config.json says is tied to the embedding.
pub fn sanitize(weights: &mut Weights, tie_word_embeddings: bool) {
    let unused: Vec<String> = weights
        .names()
        .filter(|n| n.contains("self_attn.rotary_emb.inv_freq"))
        .cloned()
        .collect();
    for name in unused {
        weights.remove(&name);
    }
    if tie_word_embeddings {
        for suffix in ["weight", "scales", "biases"] {
            weights.remove(&format!("lm_head.{suffix}"));
        }
    }
}

pub(super) fn norm(
    weights: &mut Weights,
    prefix: &str,
    eps: f32,
    family: &impl Family,
) -> LoadResult<RmsNorm> {
    let mut n = weights.rms_norm(prefix, eps)?;
    n.weight = family.norm_weight(n.weight)?;
    Ok(n)
}

/// A block's or the final norm: RMS, or a layer norm where the family's are
/// ([`Family::layer_norms`]).
fn block_norm(
    weights: &mut Weights,
    prefix: &str,
    eps: f32,
    family: &impl Family,
) -> LoadResult<Norm> {
    match family.layer_norms() {
        true => Ok(Norm::Layer(weights.layer_norm_maybe_offset(prefix, eps)?)),
        false => Ok(Norm::Rms(norm(weights, prefix, eps, family)?)),
    }
}

/// Groups layers by attention window: for each kind, the first layer of that kind; for each
/// layer, its kind.
fn mask_kinds<K: PartialEq>(windows: impl IntoIterator<Item = K>) -> (Vec<usize>, Vec<usize>) {
    let mut kinds: Vec<(K, usize)> = Vec::new();
    let layer_kinds = windows
        .into_iter()
        .enumerate()
        .map(
            |(i, window)| match kinds.iter().position(|(w, _)| *w == window) {
                Some(kind) => kind,
                None => {
                    kinds.push((window, i));
                    kinds.len() - 1
                }
            },
        )
        .collect();
    (kinds.into_iter().map(|(_, i)| i).collect(), layer_kinds)
}

pub(super) fn load_block(
    weights: &mut Weights,
    p: &str,
    spec: LayerSpec,
    family: &impl Family,
    mask_kind: usize,
) -> LoadResult<Block> {
    let eps = spec.rms_norm_eps;
    let mut load_norm = |name: &str| block_norm(weights, &format!("{p}.{name}"), eps, family);
    let norms = match spec.norms {
        NormLayout::PreNorm => Norms::PreNorm {
            input_layernorm: load_norm("input_layernorm")?,
            post_attention_layernorm: load_norm("post_attention_layernorm")?,
        },
        NormLayout::Sandwich => Norms::Sandwich {
            input_layernorm: load_norm("input_layernorm")?,
            post_attention_layernorm: load_norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: load_norm("pre_feedforward_layernorm")?,
            post_feedforward_layernorm: load_norm("post_feedforward_layernorm")?,
        },
        NormLayout::SandwichLaurel => Norms::SandwichLaurel {
            input_layernorm: load_norm("input_layernorm")?,
            post_attention_layernorm: load_norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: load_norm("pre_feedforward_layernorm")?,
            post_feedforward_layernorm: load_norm("post_feedforward_layernorm")?,
            laurel: Box::new(Laurel::load(weights, &format!("{p}.laurel"), eps)?),
        },
        NormLayout::PostNorm => Norms::PostNorm {
            post_attention_layernorm: load_norm("post_attention_layernorm")?,
            post_feedforward_layernorm: load_norm("post_feedforward_layernorm")?,
        },
        NormLayout::Parallel => Norms::Parallel {
            input_layernorm: load_norm("input_layernorm")?,
        },
        NormLayout::Single => Norms::Single {
            norm: load_norm("norm")?,
        },
    };
    let mixer = match &spec.attention {
        AttentionKind::ShortConv(conv) => {
            Mixer::ShortConv(ShortConv::load(weights, &format!("{p}.conv"), *conv)?)
        }
        AttentionKind::GatedDelta(linear) => {
            let prefix = format!("{p}.linear_attn");
            Mixer::LinearAttn(GatedDeltaNet::load(weights, &prefix, linear.clone())?)
        }
        AttentionKind::KimiDelta(kda) => {
            let prefix = format!("{p}.self_attn");
            Mixer::KimiDelta(KimiDelta::load(weights, &prefix, kda.clone())?)
        }
        AttentionKind::Softmax { output_gate } => {
            Mixer::SelfAttn(load_attention(weights, p, &spec, *output_gate, family)?)
        }
        AttentionKind::Latent(mla) => Mixer::Latent(load_latent(weights, p, mla, family)?),
        AttentionKind::Mamba(m) => {
            Mixer::Mamba(Mamba::load(weights, &format!("{p}.mamba"), m.clone())?)
        }
        AttentionKind::Mamba2(m) => {
            Mixer::Mamba2(Mamba2::load(weights, &format!("{p}.mamba"), m.clone())?)
        }
        AttentionKind::SoftmaxAndMamba2(m) => {
            let attention = load_attention(weights, p, &spec, false, family)?;
            let mamba = Mamba2::load(weights, &format!("{p}.mamba"), m.clone())?;
            Mixer::AttentionAndMamba(Box::new((attention, mamba)))
        }
        AttentionKind::None => Mixer::None,
    };
    if matches!(spec.attention, AttentionKind::SoftmaxAndMamba2(_))
        && spec.norms != NormLayout::PreNorm
    {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!("`{p}`: attention beside a Mamba2 layer needs a pre-norm block"),
        ));
    }
    let single = spec.norms == NormLayout::Single;
    let mixes = !matches!(spec.attention, AttentionKind::None);
    let has_mlp = !matches!(spec.mlp, MlpSpec::None);
    // One sublayer: a mixer or an MLP; otherwise both.
    let fits = match single {
        true => mixes != has_mlp,
        false => mixes && has_mlp,
    };
    if !fits {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "`{p}`: a block of one sublayer needs a mixer or an MLP (not both), any other \
                 block both"
            ),
        ));
    }
    let mut dense_mlp = || -> LoadResult<GatedMlp> {
        let mut linear = |name: &str| weights.linear(&format!("{p}.{name}"));
        let gate_up = match spec.fused {
            true => GateUp::Fused {
                gate_up_proj: linear("mlp.gate_up_proj")?,
            },
            false => GateUp::Split {
                gate_proj: linear("mlp.gate_proj")?,
                up_proj: linear("mlp.up_proj")?,
            },
        };
        Ok(GatedMlp {
            gate_up,
            down_proj: linear("mlp.down_proj")?,
            activation: spec.activation,
        })
    };
    let mlp = match &spec.mlp {
        MlpSpec::Dense => Mlp::Dense(dense_mlp()?),
        MlpSpec::Ungated => {
            let mut linear = |name: &str| weights.linear(&format!("{p}.mlp.{name}"));
            Mlp::Dense(GatedMlp {
                gate_up: GateUp::Ungated {
                    up_proj: linear("up_proj")?,
                },
                down_proj: linear("down_proj")?,
                activation: spec.activation,
            })
        }
        MlpSpec::None => Mlp::None,
        MlpSpec::Moe(moe) => {
            let layer = SparseMoe::load(weights, &format!("{p}.{}", moe.name), moe)?;
            Mlp::Moe(layer, moe.name)
        }
        MlpSpec::DenseAndMoe(moe) => {
            let dense = dense_mlp()?;
            let mut load_norm = |name: &str| norm(weights, &format!("{p}.{name}"), eps, family);
            Mlp::DenseAndMoe(Box::new(DenseAndMoe {
                dense,
                post_dense: load_norm("post_feedforward_layernorm_1")?,
                pre_experts: load_norm("pre_feedforward_layernorm_2")?,
                post_experts: load_norm("post_feedforward_layernorm_2")?,
                moe: SparseMoe::load(weights, p, moe)?,
            }))
        }
    };
    Ok(Block {
        mixer,
        mlp,
        norms,
        mask_kind,
        kv_from: spec.kv_from,
        shares_kv: false,
        tensor: None,
    })
}

/// The block's `self_attn` at `p`.
fn load_attention(
    weights: &mut Weights,
    p: &str,
    spec: &LayerSpec,
    output_gate: bool,
    family: &impl Family,
) -> LoadResult<Attention> {
    let eps = spec.rms_norm_eps;
    let mut load_norm = |name: &str| norm(weights, &format!("{p}.{name}"), eps, family);
    let shared = spec.kv_from.is_some();
    let qk_norm = match spec.qk_norm {
        Some(QkNormOver::Head) if shared => {
            Some(QkNorm::PerHead(load_norm("self_attn.q_norm")?, None))
        }
        Some(QkNormOver::Unscaled { eps, after_rope }) => {
            Some(QkNorm::Unscaled { eps, after_rope })
        }
        Some(over) => Some(QkNorm::new(
            over,
            load_norm("self_attn.q_norm")?,
            load_norm("self_attn.k_norm")?,
        )),
        None => None,
    };
    let sinks = match spec.sinks {
        true => Some(weights.take(&format!("{p}.self_attn.sinks"))?),
        false => None,
    };
    let mut linear = |name: &str| weights.linear(&format!("{p}.{name}"));
    let qkv = match (spec.fused, spec.values_from_keys) {
        _ if shared => Qkv::QueryOnly {
            q_proj: linear("self_attn.q_proj")?,
        },
        (true, _) => Qkv::Fused {
            qkv_proj: linear("self_attn.qkv_proj")?,
        },
        (false, true) => Qkv::KeyIsValue {
            q_proj: linear("self_attn.q_proj")?,
            k_proj: linear("self_attn.k_proj")?,
        },
        (false, false) => Qkv::Split {
            q_proj: linear("self_attn.q_proj")?,
            k_proj: linear("self_attn.k_proj")?,
            v_proj: linear("self_attn.v_proj")?,
        },
    };
    let o_proj = linear("self_attn.o_proj")?;
    Ok(Attention {
        qkv,
        o_proj,
        qk_norm,
        shape: spec.shape.clone(),
        rope: spec.rope.clone(),
        sinks,
        v_norm_eps: spec.v_norm.then_some(eps),
        output_gate,
    })
}

/// The block's latent `self_attn` at `p`, its projections' shapes checked against `mla`.
fn load_latent(
    weights: &mut Weights,
    p: &str,
    mla: &MlaSpec,
    family: &impl Family,
) -> LoadResult<LatentAttention> {
    let at = |name: &str| format!("{p}.self_attn.{name}");
    let query = match mla.q_lora_rank {
        None => LatentQuery::Direct(weights.linear(&at("q_proj"))?),
        Some(_) => LatentQuery::Compressed {
            q_a_proj: weights.linear(&at("q_a_proj"))?,
            q_a_layernorm: norm(weights, &at("q_a_layernorm"), mla.norm_eps, family)?,
            q_b_proj: weights.linear(&at("q_b_proj"))?,
        },
    };
    let attention = LatentAttention {
        spec: mla.clone(),
        query,
        kv_a_proj_with_mqa: weights.linear(&at("kv_a_proj_with_mqa"))?,
        kv_a_layernorm: norm(weights, &at("kv_a_layernorm"), mla.norm_eps, family)?,
        embed_q: MultiLinear {
            linear: weights.linear(&at("embed_q"))?,
        },
        unembed_out: MultiLinear {
            linear: weights.linear(&at("unembed_out"))?,
        },
        o_proj: weights.linear(&at("o_proj"))?,
        indexer: match &mla.indexer {
            Some(spec) if mla.q_lora_rank.is_some() => Some(Indexer {
                spec: spec.clone(),
                wq_b: weights.linear(&at("indexer.wq_b"))?,
                wk: weights.linear(&at("indexer.wk"))?,
                // mlx-lm's `nn.LayerNorm(head_dim)`: eps 1e-5, with an offset.
                k_norm: weights.layer_norm(&at("indexer.k_norm"), 1e-5)?,
                weights_proj: weights.linear(&at("indexer.weights_proj"))?,
            }),
            Some(_) => {
                return Err(EngineError::load(
                    LoadErrorKind::InvalidWeights,
                    "config.json: sparse attention's indexer reads compressed queries:                      `q_lora_rank` must be set",
                ))
            }
            None => None,
        },
    };
    check_latent_shapes(&attention, p)?;
    Ok(attention)
}

/// [`check_shapes`] for a latent attention layer: the projections and the per-head maps.
fn check_latent_shapes(a: &LatentAttention, p: &str) -> LoadResult<()> {
    let s = &a.spec;
    let q_rows = s.num_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim);
    let mut expected = vec![(
        "kv_a_proj_with_mqa",
        &a.kv_a_proj_with_mqa,
        s.kv_lora_rank + s.qk_rope_head_dim,
    )];
    match &a.query {
        LatentQuery::Direct(q_proj) => expected.push(("q_proj", q_proj, q_rows)),
        LatentQuery::Compressed {
            q_a_proj, q_b_proj, ..
        } => {
            let rank = s.q_lora_rank.unwrap_or_default();
            expected.push(("q_a_proj", q_a_proj, rank));
            expected.push(("q_b_proj", q_b_proj, q_rows));
        }
    }
    let maps = [
        ("embed_q", &a.embed_q, [s.num_heads, s.kv_lora_rank]),
        ("unembed_out", &a.unembed_out, [s.num_heads, s.v_head_dim]),
    ];
    let wrong = expected
        .iter()
        .find(|(_, l, rows)| l.dims().0 != *rows)
        .map(|(name, l, rows)| (name, l.weight.shape().to_vec(), format!("{rows} rows")))
        .or_else(|| {
            maps.iter()
                .find(|(_, m, lead)| m.linear.weight.shape()[..2] != lead[..])
                .map(|(name, m, lead)| {
                    (
                        name,
                        m.linear.weight.shape().to_vec(),
                        format!("{lead:?} leading"),
                    )
                })
        });
    match wrong {
        Some((name, shape, want)) => Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "`{p}.self_attn.{name}` has shape {shape:?} but config.json's attention sizes \
                 need {want}"
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses a block whose tensors do not have the shapes config.json implies (mlx-lm's strict
/// `load_weights` does): such a checkpoint would otherwise load and compute garbage, or fail in
/// the middle of a forward pass. `hidden` is the embedding table's width.
fn check_shapes<'a>(block: &'a Block, p: &str, hidden: i32) -> LoadResult<()> {
    // A linear-attention layer checks its convolution at load; its projections' sizes follow.
    let Mixer::SelfAttn(a) = &block.mixer else {
        return Ok(());
    };
    let (q, kv) = (
        a.shape.n_heads * a.shape.head_dim,
        a.shape.n_kv_heads * a.shape.head_dim,
    );
    // With an output gate, the query projection also gives the gate's features.
    let q_rows = if a.output_gate { 2 * q } else { q };
    let mut expected: Vec<(&str, &Linear, (i32, i32))> = match &a.qkv {
        Qkv::Split {
            q_proj,
            k_proj,
            v_proj,
        } => vec![
            ("self_attn.q_proj", q_proj, (q_rows, hidden)),
            ("self_attn.k_proj", k_proj, (kv, hidden)),
            ("self_attn.v_proj", v_proj, (kv, hidden)),
        ],
        Qkv::Fused { qkv_proj } => vec![("self_attn.qkv_proj", qkv_proj, (q + 2 * kv, hidden))],
        Qkv::KeyIsValue { q_proj, k_proj } => vec![
            ("self_attn.q_proj", q_proj, (q_rows, hidden)),
            ("self_attn.k_proj", k_proj, (kv, hidden)),
        ],
        Qkv::QueryOnly { q_proj } => vec![("self_attn.q_proj", q_proj, (q_rows, hidden))],
    };
    expected.push(("self_attn.o_proj", &a.o_proj, (hidden, q)));
    if let Some(sinks) = a.sinks.as_ref().filter(|s| s.shape() != [a.shape.n_heads]) {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "`{p}.self_attn.sinks` has shape {:?} but config.json names {} attention heads",
                sinks.shape(),
                a.shape.n_heads
            ),
        ));
    }
    let dense = |mlp: &'a GatedMlp, expected: &mut Vec<_>| {
        let intermediate = mlp.down_proj.dims().1;
        match &mlp.gate_up {
            GateUp::Split { gate_proj, up_proj } => {
                expected.push(("mlp.gate_proj", gate_proj, (intermediate, hidden)));
                expected.push(("mlp.up_proj", up_proj, (intermediate, hidden)));
            }
            GateUp::Fused { gate_up_proj } => {
                expected.push(("mlp.gate_up_proj", gate_up_proj, (2 * intermediate, hidden)))
            }
            GateUp::Ungated { up_proj } => {
                expected.push(("mlp.up_proj", up_proj, (intermediate, hidden)))
            }
        }
        expected.push(("mlp.down_proj", &mlp.down_proj, (hidden, intermediate)));
    };
    // The router gives one logit per expert; the experts' gate and up projections read the
    // hidden state (`dims` of a stacked projection: experts x inputs).
    let moe = |moe: &'a SparseMoe, name: &'a str, expected: &mut Vec<_>| {
        let switch = &moe.switch_mlp;
        let experts = switch.up_proj.0.weight.dim(0);
        expected.push((name, &moe.gate, (experts, hidden)));
        if let Some(gate) = &switch.gate_proj {
            expected.push((name, &gate.0, (experts, hidden)));
        }
        expected.push((name, &switch.up_proj.0, (experts, hidden)));
    };
    match &block.mlp {
        Mlp::Dense(mlp) => dense(mlp, &mut expected),
        Mlp::None => {}
        Mlp::Moe(m, name) => moe(m, name, &mut expected),
        Mlp::DenseAndMoe(m) => {
            dense(&m.dense, &mut expected);
            moe(&m.moe, "experts", &mut expected);
        }
    }
    for (name, linear, (out, inputs)) in expected {
        let (o, i) = linear.dims();
        if (o, i) != (out, inputs) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "`{p}.{name}` is {o}x{i} but config.json implies {out}x{inputs} (hidden \
                     {hidden}, {} heads and {} KV heads of {}): config.json does not describe \
                     these weights",
                    a.shape.n_heads, a.shape.n_kv_heads, a.shape.head_dim
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that every KV-shared layer comes after all layers with a cache and attends to an
/// earlier one of its own window kind (which also gives its mask), and marks those layers to
/// keep their keys and values.
fn check_kv_sharing(layers: &mut [Block]) -> LoadResult<()> {
    let window = |l: &Block| l.attention().map(|a| a.shape.window);
    let owners = layers.iter().filter(|l| l.kv_from.is_none()).count();
    for j in 0..layers.len() {
        let Some(src) = layers[j].kv_from else {
            continue;
        };
        let ok = j >= owners && src < owners && window(&layers[src]) == window(&layers[j]);
        if !ok {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "layer {j} would share the keys and values of layer {src}: shared layers must \
                     follow every layer with its own and share one of their window kind"
                ),
            ));
        }
        layers[src].shares_kv = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::mask_kinds;

    #[test]
    fn one_mask_per_kind_of_layer_from_its_first_layer() {
        // Gemma 3's pattern: five sliding layers, then a global one.
        let (w, g) = (Some(512), None);
        let (sources, kinds) = mask_kinds([w, w, w, w, w, g, w, w]);
        assert_eq!(sources, [0, 5]);
        assert_eq!(kinds, [0, 0, 0, 0, 0, 1, 0, 0]);
        // Llama with `layer_types`: full first.
        let (sources, kinds) = mask_kinds([g, Some(16), g, Some(16)]);
        assert_eq!(sources, [0, 1]);
        assert_eq!(kinds, [0, 1, 0, 1]);
        // All alike: one mask.
        let (sources, kinds) = mask_kinds([g, g, g]);
        assert_eq!(sources, [0]);
        assert_eq!(kinds, [0, 0, 0]);
    }
}
