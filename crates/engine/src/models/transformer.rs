//! The decoder-only transformer every architecture file here builds: embedding, blocks of
//! attention + gated MLP with RMS norms, final norm, head. A model file reads its config.json
//! into a [`LayerSpec`] per layer (what differs between families: fused projections, q/k norms,
//! norm placement, activation, attention window, RoPE or none, gated or linear attention) and calls [`Decoder::load`] with its
//! tensor names and its [`Family`]: the few computations a family does its own way (Gemma's
//! `1 + w` norms, scaled embeddings, clipped residuals), kept in the family's file.
//!
//! As in mlx-lm's model files, each forward pass builds one attention mask per kind of layer
//! (full attention, and each sliding window) and hands every layer the mask of its kind.

use std::rc::Rc;

use mlx_rs::{ops::indexing::IndexOp, Array};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::distributed::Group,
    layers::gated_delta::{GatedDeltaNet, GatedDeltaSpec},
    layers::kv_cache::{KvCache, Mask, PaddedCache, PaddedStep, StateCache},
    layers::moe::{MoeSpec, SparseMoe},
    layers::mrope::MRope,
    layers::parallel::Parallel,
    layers::parallel::{self, Placement, Reduce},
    layers::rope::rope_from_config,
    layers::weights::Weights,
    layers::{
        Activation, Attention, AttentionShape, Embedding, GateUp, GatedMlp, Linear, QkNorm,
        QkNormOver, Qkv, Result, RmsNorm, Rope, RotaryAngles, SharedKv,
    },
    models::model::LanguageModel,
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// The config.json fields every family reads the same way.
#[derive(Debug, Deserialize)]
pub struct CommonArgs {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    /// Absent: one KV head per query head.
    pub num_key_value_heads: Option<i32>,
    pub rms_norm_eps: f32,
    pub rope_scaling: Option<Value>,
}

impl CommonArgs {
    pub fn n_kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// `hidden_size / num_attention_heads`, for families without a `head_dim` field.
    pub fn default_head_dim(&self) -> i32 {
        self.hidden_size / self.num_attention_heads
    }

    /// Attention scaled by `head_dim^-0.5`.
    pub fn attention_shape(&self, head_dim: i32) -> AttentionShape {
        let (heads, kv_heads) = (self.num_attention_heads, self.n_kv_heads());
        AttentionShape::new(heads, kv_heads, head_dim, head_dim as f64)
    }

    /// RoPE over whole heads as `rope_scaling` asks (mlx-lm's `initialize_rope`).
    pub fn rope(
        &self,
        head_dim: i32,
        base: f32,
        traditional: bool,
        max_position_embeddings: Option<usize>,
    ) -> LoadResult<Rope> {
        rope_from_config(
            head_dim,
            base,
            traditional,
            self.rope_scaling.as_ref(),
            max_position_embeddings,
        )
    }

    /// Refuses a `rope_scaling` that `family`'s mlx-lm file ignores (it runs plain RoPE), so
    /// that no model runs with RoPE other than it was trained with.
    pub fn refuse_rope_scaling(&self, family: &str) -> LoadResult<()> {
        match &self.rope_scaling {
            Some(scaling) => Err(EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!(
                    "{family}: `rope_scaling` ({scaling}) is not supported (mlx-lm runs this \
                     family with plain RoPE); remove it from config.json only if the model was \
                     trained without it"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The Llama layer for these args: families adjust it from here.
    pub fn llama_layer(&self, head_dim: i32, rope: Rope) -> LayerSpec {
        LayerSpec::llama(self.rms_norm_eps, self.attention_shape(head_dim), rope)
    }
}

/// The fields mlx-lm's Llama `ModelArgs` adds to [`CommonArgs`], with its defaults: shared by
/// the families whose mlx-lm `ModelArgs` repeat them (llama, olmoe, olmo2).
#[derive(Debug, Deserialize)]
pub struct LlamaArgs {
    #[serde(flatten)]
    pub common: CommonArgs,
    /// Absent: `hidden_size / num_attention_heads`.
    pub head_dim: Option<i32>,
    pub max_position_embeddings: Option<usize>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f32 {
    10000.0
}
fn default_true() -> bool {
    true
}

impl LlamaArgs {
    pub fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.common.default_head_dim())
    }

    /// The Llama layer these args describe (RoPE as `rope_scaling` asks): families adjust it.
    pub fn layer(&self) -> LoadResult<LayerSpec> {
        let head_dim = self.head_dim();
        let max_pos = self.max_position_embeddings;
        let rope = self
            .common
            .rope(head_dim, self.rope_theta, self.rope_traditional, max_pos)?;
        Ok(self.common.llama_layer(head_dim, rope))
    }

    /// [`load_uniform`] with every layer `layer`.
    pub fn load_uniform(&self, weights: Weights, layer: LayerSpec) -> LoadResult<Decoder> {
        let (tie, max_pos) = (self.tie_word_embeddings, self.max_position_embeddings);
        load_uniform(weights, &self.common, layer, tie, max_pos)
    }
}

/// What a family computes its own way around the shared layers, where mlx-lm's model file for
/// it differs from Llama's. Every hook defaults to what Llama does; a family overrides the ones
/// it needs in its own file.
pub trait Family {
    /// The RMS-norm scale to apply, from the weight as stored (at load, once per norm).
    fn norm_weight(&self, stored: Array) -> Result<Array> {
        Ok(stored)
    }

    /// The token embeddings as the first block takes them.
    fn scale_embeddings(&self, h: Array) -> Result<Array> {
        Ok(h)
    }

    /// A residual connection: `x + y`.
    fn residual(&self, x: &Array, y: &Array) -> Result<Array> {
        x.add(y)
    }

    /// The logits as the head gives them.
    fn logits(&self, logits: Array) -> Result<Array> {
        Ok(logits)
    }

    /// Each layer's extra input `(B, L, layers, width)` for the blocks' per-layer input gates
    /// (Gemma 4), from the token ids (`None`: given embeddings) and the scaled embeddings.
    fn per_layer_inputs(&self, _tokens: Option<&Array>, _h: &Array) -> Result<Option<Array>> {
        Ok(None)
    }

    /// The family's own linear layers under their checkpoint names.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        Vec::new()
    }
}

/// The Llama family's choices: every hook as it defaults.
pub struct Llama;

impl Family for Llama {}

/// Where a block's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormLayout {
    /// `h = x + attn(norm(x)); h + mlp(norm(h))` (Llama, Qwen, Mistral, Phi-3).
    PreNorm,
    /// Also a norm on each sublayer's output before the residual add (Gemma 3).
    Sandwich,
    /// Only the norms on the sublayers' outputs: `h = x + norm(attn(x)); h + norm(mlp(h))`
    /// (OLMo 2).
    PostNorm,
}

/// What mixes positions in a layer.
#[derive(Debug, Clone)]
pub enum AttentionKind {
    /// Softmax attention over a KV cache (`self_attn`); `output_gate`: its output gated by a
    /// sigmoid of features the query projection also gives (Qwen3-Next).
    Softmax { output_gate: bool },
    /// Linear attention with a recurrent state (`linear_attn`, Qwen3-Next's other layers): the
    /// layer's `shape`, `rope` and `qk_norm` do not apply.
    GatedDelta(GatedDeltaSpec),
}

/// How one layer of a family is built from its checkpoint.
#[derive(Debug, Clone)]
pub struct LayerSpec {
    pub attention: AttentionKind,
    /// One `qkv_proj` / `gate_up_proj` matrix instead of separate ones (Phi-3).
    pub fused: bool,
    /// `q_norm` / `k_norm` before RoPE: over each head's features (Qwen3, Gemma 3) or the
    /// whole projection (OLMoE).
    pub qk_norm: Option<QkNormOver>,
    pub norms: NormLayout,
    pub activation: Activation,
    /// A dense gated MLP, or a sparse mixture of experts.
    pub mlp: MlpSpec,
    pub rms_norm_eps: f32,
    pub shape: AttentionShape,
    /// `None`: the layer attends without positional encoding (SmolLM3's NoPE layers).
    pub rope: Option<Rope>,
    /// Learned attention sinks, one logit per query head (`self_attn.sinks`, GPT-OSS).
    pub sinks: bool,
    /// No `v_proj`: the values are the key projection (Gemma 4's `attention_k_eq_v`).
    pub values_from_keys: bool,
    /// Values RMS-normalised per head without a scale (Gemma 4).
    pub v_norm: bool,
    /// The block's output multiplied by its stored `layer_scalar` (Gemma 4).
    pub layer_scalar: bool,
    /// A gate that adds the layer's per-layer input ([`Family::per_layer_inputs`]) to the
    /// block's output (Gemma 4).
    pub per_layer_input: bool,
    /// Attends to the keys and values of this earlier layer, with no k/v projections, key norm
    /// or cache of its own (Gemma 4's KV-shared layers; they come after every layer with a
    /// cache).
    pub kv_from: Option<usize>,
}

/// The MLP of a layer.
#[derive(Debug, Clone)]
pub enum MlpSpec {
    /// `mlp.{gate,up,down}_proj` (or fused `gate_up_proj`).
    Dense,
    /// Router and experts ([`crate::layers::moe`]).
    Moe(MoeSpec),
    /// A dense MLP (`mlp`) and router and experts (named from the block) side by side, each
    /// output normed (`post_feedforward_layernorm_1`, `_2`), summed: Gemma 4's MoE block. The
    /// experts run on their own pre-norm (`pre_feedforward_layernorm_2`) of the block's input,
    /// which the router takes un-normed.
    DenseAndMoe(MoeSpec),
}

impl LayerSpec {
    /// The Llama layer: separate projections, pre-norm, SwiGLU; families adjust from here.
    pub fn llama(rms_norm_eps: f32, shape: AttentionShape, rope: Rope) -> Self {
        Self {
            attention: AttentionKind::Softmax { output_gate: false },
            fused: false,
            qk_norm: None,
            norms: NormLayout::PreNorm,
            activation: Activation::Silu,
            mlp: MlpSpec::Dense,
            rms_norm_eps,
            shape,
            rope: Some(rope),
            sinks: false,
            values_from_keys: false,
            v_norm: false,
            layer_scalar: false,
            per_layer_input: false,
            kv_from: None,
        }
    }
}

/// The model-level choices.
pub struct DecoderSpec {
    pub layers: Vec<LayerSpec>,
    pub rms_norm_eps: f32,
    /// The output head is the embedding table.
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: Option<usize>,
}

impl DecoderSpec {
    /// Makes sparse every layer Qwen3-MoE's rule (kept by Qwen3-Next) makes sparse: not in
    /// `mlp_only_layers`, experts configured, and `(i + 1) % step == 0`.
    pub fn make_sparse(&mut self, moe: &MoeSpec, step: usize, mlp_only_layers: &[usize]) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let sparse = !mlp_only_layers.contains(&i)
                && moe.num_experts > 0
                && step > 0
                && (i + 1) % step == 0;
            if sparse {
                layer.mlp = MlpSpec::Moe(moe.clone());
            }
        }
    }

    /// `n` copies of one layer, final norm as the layers'.
    pub fn uniform(
        layer: LayerSpec,
        n: usize,
        tie_word_embeddings: bool,
        max_position_embeddings: Option<usize>,
    ) -> Self {
        Self {
            rms_norm_eps: layer.rms_norm_eps,
            layers: vec![layer; n],
            tie_word_embeddings,
            max_position_embeddings,
        }
    }
}

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

enum Norms {
    PreNorm {
        input_layernorm: RmsNorm,
        post_attention_layernorm: RmsNorm,
    },
    Sandwich {
        input_layernorm: RmsNorm,
        post_attention_layernorm: RmsNorm,
        pre_feedforward_layernorm: RmsNorm,
        post_feedforward_layernorm: RmsNorm,
    },
    PostNorm {
        post_attention_layernorm: RmsNorm,
        post_feedforward_layernorm: RmsNorm,
    },
}

/// A block's MLP.
enum Mlp {
    Dense(GatedMlp),
    /// Under its checkpoint name (`mlp`, Mixtral's `block_sparse_moe`).
    Moe(SparseMoe, &'static str),
    DenseAndMoe(Box<DenseAndMoe>),
}

/// [`MlpSpec::DenseAndMoe`]'s layers.
struct DenseAndMoe {
    dense: GatedMlp,
    post_dense: RmsNorm,
    pre_experts: RmsNorm,
    post_experts: RmsNorm,
    moe: SparseMoe,
}

impl Mlp {
    /// The MLP's output for `x` (the block's input after the norm before the MLP, if any);
    /// `block_input` is that input un-normed.
    fn forward(&self, x: &Array, block_input: &Array) -> Result<Array> {
        match self {
            Mlp::Dense(mlp) => mlp.forward(x),
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
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        fn dense(mlp: &mut GatedMlp) -> Vec<(String, &mut Linear)> {
            let named = mlp.linears_mut().into_iter();
            named.map(|(n, l)| (format!("mlp.{n}"), l)).collect()
        }
        match self {
            Mlp::Dense(mlp) => dense(mlp),
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

/// A block's attention: over a KV cache, or linear with a recurrent state.
enum Mixer {
    SelfAttn(Attention),
    LinearAttn(GatedDeltaNet),
}

struct Block {
    mixer: Mixer,
    mlp: Mlp,
    norms: Norms,
    /// Which of the forward pass's masks this layer takes (an index into
    /// [`Decoder::mask_sources`]).
    mask_kind: usize,
    /// Multiplies the block's output (Gemma 4).
    layer_scalar: Option<Array>,
    per_layer_gate: Option<PerLayerGate>,
    /// The layer whose keys and values this one attends to, when not its own.
    kv_from: Option<usize>,
    /// Later layers attend to this one's keys and values.
    shares_kv: bool,
    /// Under tensor parallel: the sums of the attention's and the MLP's partial outputs.
    tensor: Option<TensorReduce>,
}

/// A tensor-parallel block's two sums over the group (`models/parallel.rs`).
struct TensorReduce {
    attention: Reduce,
    mlp: Reduce,
}

/// Gemma 4's per-layer input gate: `h + norm(projection(gelu_approx(gate(h)) * input))`.
struct PerLayerGate {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

impl PerLayerGate {
    fn forward(&self, h: &Array, input: &Array) -> Result<Array> {
        let gate = crate::layers::gelu_approx(&self.per_layer_input_gate.forward(h)?)?;
        let gate = self.per_layer_projection.forward(&gate.multiply(input)?)?;
        h.add(self.post_per_layer_input_norm.forward(&gate)?)
    }
}

/// Where a block's attention gets its keys and values.
enum LayerKv<'a> {
    /// Its own, through its cache.
    Cache(&'a mut KvCache),
    /// An earlier layer's, of this pass.
    Shared(&'a SharedKv),
    /// One cache per row of a batch of sequences, each with its mask ([`Decoder::forward_rows`]).
    Rows(Vec<(&'a mut KvCache, &'a Mask)>),
    /// Layer `.1` of a batch's padded cache, in the step `.2` ([`Decoder::forward_padded`]).
    Padded(&'a mut PaddedCache, usize, &'a PaddedStep),
    /// One cache per sequence whose positions follow each other along the pass's sequence axis,
    /// each with its mask and length ([`Decoder::prefill_segments`]).
    Segments(Vec<(&'a mut KvCache, &'a Mask, i32)>),
}

impl Block {
    /// Its softmax attention (`None` for a linear-attention layer).
    fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            Mixer::SelfAttn(a) => Some(a),
            Mixer::LinearAttn(_) => None,
        }
    }

    /// The block's output, and its keys and values when later layers share them.
    fn forward(
        &self,
        family: &impl Family,
        x: &Array,
        mask: &Mask,
        kv: LayerKv,
        angles: Option<&RotaryAngles>,
        per_layer_input: Option<&Array>,
    ) -> Result<(Array, Option<SharedKv>)> {
        let mut kept = None;
        let attn = |x: &Array| match (&self.mixer, kv) {
            (Mixer::SelfAttn(a), LayerKv::Cache(cache)) => {
                let (out, shared) = a.forward(x, mask, cache, angles, self.shares_kv)?;
                kept = shared;
                match &self.tensor {
                    Some(t) => t.attention.apply(out),
                    None => Ok(out),
                }
            }
            (Mixer::SelfAttn(a), LayerKv::Shared(shared)) => a.forward_shared(x, mask, shared),
            (Mixer::SelfAttn(a), LayerKv::Rows(rows)) => {
                let out = a.forward_rows(x, rows)?;
                match &self.tensor {
                    Some(t) => t.attention.apply(out),
                    None => Ok(out),
                }
            }
            (Mixer::SelfAttn(a), LayerKv::Padded(cache, layer, step)) => {
                let out = a.forward_padded(x, cache, layer, step)?;
                match &self.tensor {
                    Some(t) => t.attention.apply(out),
                    None => Ok(out),
                }
            }
            (Mixer::SelfAttn(a), LayerKv::Segments(segments)) => {
                let out = a.forward_segments(x, segments)?;
                match &self.tensor {
                    Some(t) => t.attention.apply(out),
                    None => Ok(out),
                }
            }
            (Mixer::LinearAttn(l), LayerKv::Segments(segments)) => {
                let mut start = 0;
                let mut outs = Vec::with_capacity(segments.len());
                for (cache, _, len) in segments {
                    let KvCache::State(state) = cache else {
                        return Err(mlx_rs::error::Exception::custom(
                            "a linear-attention layer needs a state cache",
                        ));
                    };
                    let part = x.index((.., start..start + len, ..));
                    outs.push(l.forward(&part, state)?);
                    start += len;
                }
                mlx_rs::ops::concatenate(&outs, 1)
            }
            (Mixer::LinearAttn(l), LayerKv::Rows(rows)) => {
                let outs = (rows.into_iter().enumerate())
                    .map(|(b, (cache, _))| match cache {
                        KvCache::State(state) => l.forward(&crate::layers::row(x, b), state),
                        _ => Err(mlx_rs::error::Exception::custom(
                            "a linear-attention layer needs a state cache",
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?;
                mlx_rs::ops::concatenate(&outs, 0)
            }
            (Mixer::LinearAttn(l), LayerKv::Cache(KvCache::State(state))) => l.forward(x, state),
            (Mixer::LinearAttn(_), _) => Err(mlx_rs::error::Exception::custom(
                "a linear-attention layer needs a state cache",
            )),
        };
        let out = self.sublayers(family, x, attn)?;
        let out = match (&self.per_layer_gate, per_layer_input) {
            (Some(gate), Some(input)) => gate.forward(&out, input)?,
            _ => out,
        };
        let out = match &self.layer_scalar {
            Some(s) => out.multiply(s)?,
            None => out,
        };
        Ok((out, kept))
    }

    /// The MLP's output (summed over the group under tensor parallel); `block_input`: `x`
    /// before its norm ([`Mlp::forward`]).
    fn mlp_forward(&self, x: &Array, block_input: &Array) -> Result<Array> {
        let out = self.mlp.forward(x, block_input)?;
        match &self.tensor {
            Some(t) => t.mlp.apply(out),
            None => Ok(out),
        }
    }

    /// Attention and MLP with their norms and residuals, as the norm layout places them.
    fn sublayers(
        &self,
        family: &impl Family,
        x: &Array,
        attn: impl FnOnce(&Array) -> Result<Array>,
    ) -> Result<Array> {
        match &self.norms {
            Norms::PreNorm {
                input_layernorm,
                post_attention_layernorm,
            } => {
                let h = family.residual(x, &attn(&input_layernorm.forward(x)?)?)?;
                let r = self.mlp_forward(&post_attention_layernorm.forward(&h)?, &h)?;
                family.residual(&h, &r)
            }
            Norms::Sandwich {
                input_layernorm,
                post_attention_layernorm,
                pre_feedforward_layernorm,
                post_feedforward_layernorm,
            } => {
                let r = attn(&input_layernorm.forward(x)?)?;
                let h = family.residual(x, &post_attention_layernorm.forward(&r)?)?;
                let r = self.mlp_forward(&pre_feedforward_layernorm.forward(&h)?, &h)?;
                family.residual(&h, &post_feedforward_layernorm.forward(&r)?)
            }
            Norms::PostNorm {
                post_attention_layernorm,
                post_feedforward_layernorm,
            } => {
                let r = attn(x)?;
                let h = family.residual(x, &post_attention_layernorm.forward(&r)?)?;
                let r = self.mlp_forward(&h, &h)?;
                family.residual(&h, &post_feedforward_layernorm.forward(&r)?)
            }
        }
    }
}

pub struct Decoder<F: Family = Llama> {
    family: F,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    /// Per kind of layer (full attention, each sliding window, in order of first appearance):
    /// the first layer of that kind, whose cache gives the kind's mask (mlx-lm's `fa_idx` /
    /// `swa_idx`). All caches of one kind hold the same positions, so one mask serves them all.
    mask_sources: Vec<usize>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    max_position_embeddings: Option<usize>,
    /// Multimodal RoPE in place of every layer's own (Qwen-VL): positions are given per token.
    mrope: Option<MRope>,
    /// This rank's share of a model split over a group.
    placement: Option<Placement>,
    /// The checkpoint index of `layers[0]` (a pipeline stage's first layer; else 0).
    first_layer: usize,
    /// The checkpoint's layer count (more than `layers` holds on a pipeline's stage).
    total_layers: usize,
    /// Under tensor parallel, the group an untied head's vocabulary is split over: each rank
    /// computes its rows' logits, gathered after.
    vocab_split: Option<Rc<Group>>,
}

fn norm(
    weights: &mut Weights,
    prefix: &str,
    eps: f32,
    family: &impl Family,
) -> LoadResult<RmsNorm> {
    let mut n = weights.rms_norm(prefix, eps)?;
    n.weight = family.norm_weight(n.weight)?;
    Ok(n)
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

fn load_block(
    weights: &mut Weights,
    p: &str,
    spec: LayerSpec,
    family: &impl Family,
    mask_kind: usize,
) -> LoadResult<Block> {
    let eps = spec.rms_norm_eps;
    let mut load_norm = |name: &str| norm(weights, &format!("{p}.{name}"), eps, family);
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
        NormLayout::PostNorm => Norms::PostNorm {
            post_attention_layernorm: load_norm("post_attention_layernorm")?,
            post_feedforward_layernorm: load_norm("post_feedforward_layernorm")?,
        },
    };
    let mixer = match &spec.attention {
        AttentionKind::GatedDelta(linear) => {
            let prefix = format!("{p}.linear_attn");
            Mixer::LinearAttn(GatedDeltaNet::load(weights, &prefix, linear.clone())?)
        }
        AttentionKind::Softmax { output_gate } => {
            Mixer::SelfAttn(load_attention(weights, p, &spec, *output_gate, family)?)
        }
    };
    let per_layer_gate = match spec.per_layer_input {
        true => Some(PerLayerGate {
            per_layer_input_gate: weights.linear(&format!("{p}.per_layer_input_gate"))?,
            per_layer_projection: weights.linear(&format!("{p}.per_layer_projection"))?,
            post_per_layer_input_norm: norm(
                weights,
                &format!("{p}.post_per_layer_input_norm"),
                eps,
                family,
            )?,
        }),
        false => None,
    };
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
        layer_scalar: match spec.layer_scalar {
            true => Some(weights.take(&format!("{p}.layer_scalar"))?),
            false => None,
        },
        per_layer_gate,
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
        }
        expected.push(("mlp.down_proj", &mlp.down_proj, (hidden, intermediate)));
    };
    // The router gives one logit per expert; the experts' gate and up projections read the
    // hidden state (`dims` of a stacked projection: experts x inputs).
    let moe = |moe: &'a SparseMoe, name: &'a str, expected: &mut Vec<_>| {
        let switch = &moe.switch_mlp;
        let experts = switch.gate_proj.0.weight.dim(0);
        expected.push((name, &moe.gate, (experts, hidden)));
        expected.push((name, &switch.gate_proj.0, (experts, hidden)));
        expected.push((name, &switch.up_proj.0, (experts, hidden)));
    };
    match &block.mlp {
        Mlp::Dense(mlp) => dense(mlp, &mut expected),
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

impl<F: Family> Decoder<F> {
    /// Builds the model from Hugging Face tensor names (`model.layers.N.self_attn.q_proj`, ...).
    pub fn load(mut weights: Weights, spec: DecoderSpec, family: F) -> LoadResult<Self> {
        let placement = weights.take_placement();
        let owned = stage(placement.as_ref(), &spec.layers)?;
        let total_layers = spec.layers.len();
        // Linear-attention layers are a kind of their own (their cache gives no mask).
        let kind = |l: &LayerSpec| match l.attention {
            AttentionKind::Softmax { .. } => Some(l.shape.window),
            AttentionKind::GatedDelta(_) => None,
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
            let mut block = load_block(&mut weights, &p, layer, &family, kind)?;
            check_shapes(&block, &p, hidden)?;
            if let Some(pl) = placement.as_ref().filter(|pl| pl.mode == Parallel::Tensor) {
                shard_block(&mut block, &pl.group, &p)?;
            }
            layers.push(block);
        }
        check_kv_sharing(&mut layers)?;
        let mut model = Self {
            embed_tokens,
            layers,
            mask_sources,
            norm: norm(&mut weights, "model.norm", spec.rms_norm_eps, &family)?,
            lm_head: match spec.tie_word_embeddings {
                true => None,
                false => Some(weights.linear("lm_head")?),
            },
            vocab_split: None,
            max_position_embeddings: spec.max_position_embeddings,
            family,
            mrope: None,
            placement,
            first_layer: owned.start,
            total_layers,
        };
        model.split_vocabulary()?;
        Ok(model)
    }

    /// Under tensor parallel, an untied head whose vocabulary the ranks divide keeps this rank's
    /// share of its rows (a tied head is the embedding table, which every rank holds whole).
    fn split_vocabulary(&mut self) -> LoadResult<()> {
        let tensor = self
            .placement
            .as_ref()
            .filter(|p| p.mode == Parallel::Tensor);
        let (Some(p), Some(head)) = (tensor, self.lm_head.as_mut()) else {
            return Ok(());
        };
        if head.weight.dim(0) % p.group.size() as i32 != 0 {
            return Ok(());
        }
        head.shard_rows(&p.group, "lm_head")?;
        self.vocab_split = Some(p.group.clone());
        Ok(())
    }

    /// Every layer rotates by `mrope` at explicit positions
    /// ([`LanguageModel::forward_embeddings_at`]; without them, at the cache offset on all
    /// three rows) instead of by its own RoPE.
    pub fn with_mrope(mut self, mrope: MRope) -> Self {
        self.mrope = Some(mrope);
        self
    }

    /// Whether [`Self::forward_rows`] can run this model: not with multimodal RoPE (positions
    /// per token), layers that share another layer's keys, or a split over a group.
    fn rows_supported(&self) -> bool {
        self.mrope.is_none()
            && self.placement.is_none()
            && self.layers.iter().all(|l| l.kv_from.is_none())
    }

    /// One decode step of several sequences at once: `tokens` `(B, 1)`, row `b` continuing the
    /// sequence `caches[b]` holds. Embeddings, projections, MLPs and the head run over all rows
    /// together (one pass over the weights serves the batch); RoPE, the cache update and
    /// attention run per row at its own offset with its own mask, exactly as a single
    /// sequence's step does. Logits `(B, 1, vocab)`.
    fn forward_rows(&self, tokens: &Array, caches: &mut [&mut [KvCache]]) -> Result<Array> {
        if !self.rows_supported() {
            return Err(mlx_rs::error::Exception::custom(
                "this model runs one sequence at a time",
            ));
        }
        if let Some(c) = caches.iter().find(|c| c.len() != self.cache_count()) {
            return Err(mlx_rs::error::Exception::custom(format!(
                "{} layers need one KV cache each, got {}",
                self.cache_count(),
                c.len()
            )));
        }
        let h = self.family.scale_embeddings(self.embed(tokens)?)?;
        let per_layer = self.family.per_layer_inputs(Some(tokens), &h)?;
        // Each row's masks, one per kind of layer, asked before any layer adds this step.
        let masks = (caches.iter())
            .map(|c| {
                let kinds = self.mask_sources.iter().map(|&i| c[i].mask(1));
                kinds.collect::<Result<Vec<Mask>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let mut h = h;
        for (i, layer) in self.layers.iter().enumerate() {
            let rows = (caches.iter_mut().zip(&masks))
                .map(|(c, m)| (&mut c[i], &m[layer.mask_kind]))
                .collect();
            let input = match &per_layer {
                Some(p) => Some(p.take_axis(Array::from_int(i as i32), 2)?),
                None => None,
            };
            let no_mask = Mask::None;
            let kv = LayerKv::Rows(rows);
            (h, _) = layer.forward(&self.family, &h, &no_mask, kv, None, input.as_ref())?;
        }
        self.head(&h)
    }

    /// Prefill chunks of several sequences in one pass: `tokens` `(1, ΣL)` holds sequence
    /// `s`'s `lens[s]` tokens in turn, continuing `caches[s]`. Embeddings, projections and MLPs
    /// run over all positions together; RoPE, the cache update and attention per sequence, at
    /// its offset and with its mask, as its chunk alone. Logits `(1, S, vocab)` of each
    /// sequence's last position (lazy: a chunk before the last never computes them).
    fn prefill_segments(
        &self,
        tokens: &Array,
        lens: &[i32],
        caches: &mut [&mut [KvCache]],
    ) -> Result<Array> {
        if !self.rows_supported() {
            return Err(mlx_rs::error::Exception::custom(
                "this model runs one sequence at a time",
            ));
        }
        if caches.len() != lens.len() || caches.iter().any(|c| c.len() != self.cache_count()) {
            return Err(mlx_rs::error::Exception::custom(
                "one length and one KV cache per layer for each sequence",
            ));
        }
        let h = self.family.scale_embeddings(self.embed(tokens)?)?;
        let per_layer = self.family.per_layer_inputs(Some(tokens), &h)?;
        let masks = (caches.iter().zip(lens))
            .map(|(c, &n)| {
                let kinds = self.mask_sources.iter().map(|&i| c[i].mask(n));
                kinds.collect::<Result<Vec<Mask>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let mut h = h;
        for (i, layer) in self.layers.iter().enumerate() {
            let segments = (caches.iter_mut().zip(&masks).zip(lens))
                .map(|((c, m), &n)| (&mut c[i], &m[layer.mask_kind], n))
                .collect();
            let input = match &per_layer {
                Some(p) => Some(p.take_axis(Array::from_int(i as i32), 2)?),
                None => None,
            };
            let kv = LayerKv::Segments(segments);
            (h, _) = layer.forward(&self.family, &h, &Mask::None, kv, None, input.as_ref())?;
        }
        let ends: Vec<i32> = (lens.iter())
            .scan(0, |end, &n| {
                *end += n;
                Some(*end - 1)
            })
            .collect();
        self.head(&h.take_axis(Array::from_slice(&ends, &[ends.len() as i32]), 1)?)
    }

    /// Whether [`Self::forward_padded`] can run this model: as [`Self::rows_supported`], and
    /// every layer softmax attention without a temperature (whose caches are then the
    /// full-attention ones a padded cache takes, or the batch attends row by row).
    fn padded_supported(&self) -> bool {
        self.rows_supported()
            && self
                .layers
                .iter()
                .all(|l| matches!(&l.mixer, Mixer::SelfAttn(a) if a.shape.temperature.is_none()))
    }

    /// [`Self::forward_rows`] over a padded cache holding every row's caches: per layer one
    /// scatter writes all rows' keys and values and one attention call serves all rows, each
    /// under its own mask. Logits `(B, 1, vocab)`, row `b` for `cache.ids()[b]`.
    fn forward_padded(&self, tokens: &Array, cache: &mut PaddedCache) -> Result<Array> {
        if !self.padded_supported() {
            return Err(mlx_rs::error::Exception::custom(
                "this model's batches attend row by row",
            ));
        }
        let mut h = self.family.scale_embeddings(self.embed(tokens)?)?;
        let per_layer = self.family.per_layer_inputs(Some(tokens), &h)?;
        let step = cache.step()?;
        for (i, layer) in self.layers.iter().enumerate() {
            let input = match &per_layer {
                Some(p) => Some(p.take_axis(Array::from_int(i as i32), 2)?),
                None => None,
            };
            let kv = LayerKv::Padded(cache, i, &step);
            (h, _) = layer.forward(&self.family, &h, &Mask::None, kv, None, input.as_ref())?;
        }
        self.head(&h)
    }

    /// The final norm, the head (or the tied embedding) and the family's logit processing.
    fn head(&self, h: &Array) -> Result<Array> {
        let h = self.norm.forward(h)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => self.embed_tokens.as_linear(&h)?,
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

    /// The forward pass; `positions` `(3, L)` only for an M-RoPE model, which may also add
    /// `deepstack[i]` to the output of layer `i`.
    fn forward_at(
        &self,
        h: Array,
        positions: Option<&Array>,
        deepstack: &[Array],
        caches: &mut [KvCache],
        tokens: Option<&Array>,
    ) -> Result<Array> {
        if caches.len() != self.cache_count() {
            return Err(mlx_rs::error::Exception::custom(format!(
                "{} layers need one KV cache each, got {}",
                self.cache_count(),
                caches.len()
            )));
        }
        let mut h = self.family.scale_embeddings(h)?;
        let per_layer = self.family.per_layer_inputs(tokens, &h)?;
        // mlx-lm's `create_attention_mask`, once per kind of layer, asked of that kind's first
        // cache before any layer adds this pass's positions.
        let n = h.dim(1);
        let masks = self
            .mask_sources
            .iter()
            .map(|&i| caches[i].mask(n))
            .collect::<Result<Vec<Mask>>>()?;
        // M-RoPE's angles, once per pass (mlx-vlm's `position_embeddings`).
        let angles = match (&self.mrope, positions) {
            (Some(m), Some(p)) => Some(m.angles(p, h.dtype())?),
            (Some(m), None) => {
                let start = caches.first().map_or(0, KvCache::offset);
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
        let pipeline = self
            .placement
            .as_ref()
            .filter(|p| p.mode == Parallel::Pipeline);
        if let Some(p) = pipeline {
            h = parallel::receive(p, h)?;
        }
        // Keys and values of this pass that later layers share (mlx-lm's `intermediates`).
        let mut kept: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = &masks[layer.mask_kind];
            let kv = match layer.kv_from {
                Some(src) => LayerKv::Shared(kept[src].as_ref().ok_or_else(|| {
                    mlx_rs::error::Exception::custom(format!("layer {src} kept no keys"))
                })?),
                None => LayerKv::Cache(&mut caches[i]),
            };
            let input = match &per_layer {
                Some(p) => Some(p.take_axis(Array::from_int(i as i32), 2)?),
                None => None,
            };
            let (out, shared) =
                layer.forward(&self.family, &h, mask, kv, angles.as_ref(), input.as_ref())?;
            h = out;
            if shared.is_some() {
                kept[i] = shared;
            }
            if let Some(rows) = deepstack.get(i) {
                h = h.add(rows)?;
            }
        }
        if let Some(p) = pipeline {
            h = parallel::hand_on(p, h)?;
        }
        self.head(&h)
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

impl<F: Family> Decoder<F> {
    /// Layers with a KV cache of their own: all but the KV-shared ones, which follow them.
    fn cache_count(&self) -> usize {
        self.layers.iter().filter(|l| l.kv_from.is_none()).count()
    }
}

impl<F: Family> LanguageModel for Decoder<F> {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.forward_at(self.embed(tokens)?, None, &[], caches, Some(tokens))
    }

    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_rows(&self, tokens: &Array, caches: &mut [&mut [KvCache]]) -> Result<Array> {
        Decoder::forward_rows(self, tokens, caches)
    }

    fn rows_supported(&self) -> bool {
        Decoder::rows_supported(self)
    }

    fn forward_padded(&self, tokens: &Array, cache: &mut PaddedCache) -> Result<Array> {
        Decoder::forward_padded(self, tokens, cache)
    }

    fn prefill_segments(
        &self,
        tokens: &Array,
        lens: &[i32],
        caches: &mut [&mut [KvCache]],
    ) -> Result<Array> {
        Decoder::prefill_segments(self, tokens, lens, caches)
    }

    fn padded_supported(&self) -> bool {
        Decoder::padded_supported(self)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut [KvCache]) -> Result<Array> {
        self.forward_at(h, None, &[], caches, None)
    }

    fn forward_embeddings_at(
        &self,
        h: Array,
        positions: &Array,
        deepstack: &[Array],
        caches: &mut [KvCache],
    ) -> Result<Array> {
        self.forward_at(h, Some(positions), deepstack, caches, None)
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn quantizable_kv_head_dims(&self) -> Vec<i32> {
        let own = self.layers.iter().filter(|l| l.kv_from.is_none());
        let attention = own.filter_map(|l| l.attention()).map(|a| &a.shape);
        attention
            .filter(|s| s.window.is_none())
            .map(|s| s.head_dim)
            .collect()
    }

    fn kv_bits_refusal(&self) -> Option<String> {
        let sinks = |l: &Block| l.attention().is_some_and(|a| a.sinks.is_some());
        if self.layers.iter().any(sinks) {
            return Some(
                "this model's attention has sinks, which attention over a quantized KV cache \
                 does not take (mlx-lm refuses it too), so its KV cache cannot be quantized"
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

    fn make_caches(&self) -> Vec<KvCache> {
        let cache = |l: &Block| match &l.mixer {
            Mixer::SelfAttn(a) => KvCache::for_window(a.shape.window),
            Mixer::LinearAttn(_) => KvCache::State(StateCache::default()),
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
            };
            let p = format!("model.layers.{}", i + self.first_layer);
            out.extend(
                attn.into_iter()
                    .map(|(n, linear)| (format!("{p}.{name}.{n}"), linear)),
            );
            let mlp = l.mlp.linears_mut().into_iter();
            out.extend(mlp.map(|(n, linear)| (format!("{p}.{n}"), linear)));
            if let Some(g) = &mut l.per_layer_gate {
                out.push((
                    format!("{p}.per_layer_input_gate"),
                    &mut g.per_layer_input_gate,
                ));
                out.push((
                    format!("{p}.per_layer_projection"),
                    &mut g.per_layer_projection,
                ));
            }
        }
        out.extend(self.family.linears_mut());
        out.extend(self.lm_head.as_mut().map(|h| ("lm_head".to_owned(), h)));
        out
    }

    fn max_position_embeddings(&self) -> Option<usize> {
        self.max_position_embeddings
    }

    fn placement(&self) -> Option<(&Placement, std::ops::Range<usize>)> {
        let layers = self.first_layer..self.first_layer + self.layers.len();
        self.placement.as_ref().map(|p| (p, layers))
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

    fn held_elsewhere(&self, name: &str) -> bool {
        let layer = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|k| k.parse::<usize>().ok());
        let owned = self.first_layer..self.first_layer + self.layers.len();
        layer.is_some_and(|k| k < self.total_layers && !owned.contains(&k))
    }
}

/// The layers this rank builds: a pipeline stage's, else all. A pipeline hands the hidden
/// state between ranks only: layers that reach into other layers (KV sharing, per-layer
/// inputs) stay on one rank.
fn stage(
    placement: Option<&Placement>,
    layers: &[LayerSpec],
) -> LoadResult<std::ops::Range<usize>> {
    let Some(p) = placement.filter(|p| p.mode == Parallel::Pipeline) else {
        return Ok(0..layers.len());
    };
    parallel::check_stage(p, layers.len())?;
    if layers
        .iter()
        .any(|l| l.kv_from.is_some() || l.per_layer_input)
    {
        return Err(parallel::refuse(
            "this model's layers read other layers' keys or per-layer inputs, which a \
             pipeline does not hand between ranks",
        ));
    }
    Ok(p.stage(layers.len()))
}

/// Splits a block's heads and MLP columns over the group (tensor parallel, as mlx-lm's
/// `shard` methods): softmax attention with separate q/k/v and a dense gated MLP with
/// separate gate/up only; the rest is refused, never run unsplit.
fn shard_block(block: &mut Block, group: &Rc<Group>, p: &str) -> LoadResult<()> {
    let refused = |what: &str| {
        parallel::refuse(format!(
            "tensor parallel splits attention heads and dense MLPs; `{p}` has {what}: use \
             parallel \"pipeline\""
        ))
    };
    if block.kv_from.is_some() || block.per_layer_gate.is_some() {
        return Err(refused("KV sharing or a per-layer input gate"));
    }
    let Mixer::SelfAttn(a) = &mut block.mixer else {
        return Err(refused("linear attention"));
    };
    let Mlp::Dense(mlp) = &mut block.mlp else {
        return Err(refused("a mixture of experts"));
    };
    if matches!(a.qk_norm, Some(QkNorm::Whole(..))) {
        return Err(refused("a query/key norm over all heads at once"));
    }
    let n = group.size() as i32;
    if a.shape.n_heads % n != 0 || a.shape.n_kv_heads % n != 0 {
        return Err(parallel::refuse(format!(
            "{} attention heads and {} key/value heads cannot be split over {n} ranks: use a \
             number of ranks that divides both, or parallel \"pipeline\"",
            a.shape.n_heads, a.shape.n_kv_heads
        )));
    }
    let Qkv::Split {
        q_proj,
        k_proj,
        v_proj,
    } = &mut a.qkv
    else {
        return Err(refused("fused projections"));
    };
    q_proj.shard_rows(group, &format!("{p}.self_attn.q_proj"))?;
    k_proj.shard_rows(group, &format!("{p}.self_attn.k_proj"))?;
    v_proj.shard_rows(group, &format!("{p}.self_attn.v_proj"))?;
    if let Some(sinks) = &a.sinks {
        a.sinks = Some(parallel::part(
            sinks,
            0,
            group,
            &format!("{p}.self_attn.sinks"),
        )?);
    }
    a.shape.n_heads /= n;
    a.shape.n_kv_heads /= n;
    let attention = a
        .o_proj
        .shard_columns(group, &format!("{p}.self_attn.o_proj"))?;
    let GateUp::Split { gate_proj, up_proj } = &mut mlp.gate_up else {
        return Err(refused("a fused gate/up projection"));
    };
    gate_proj.shard_rows(group, &format!("{p}.mlp.gate_proj"))?;
    up_proj.shard_rows(group, &format!("{p}.mlp.up_proj"))?;
    let mlp = mlp
        .down_proj
        .shard_columns(group, &format!("{p}.mlp.down_proj"))?;
    block.tensor = Some(TensorReduce { attention, mlp });
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
