//! What a family builds from config.json: the fields most families share (`CommonArgs`,
//! `LlamaArgs`), each layer's [`LayerSpec`], the whole model's [`DecoderSpec`].

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::gated_delta::GatedDeltaSpec,
    layers::kimi_delta::KdaSpec,
    layers::mamba::MambaSpec,
    layers::mamba2::Mamba2Spec,
    layers::mla::MlaSpec,
    layers::moe::MoeSpec,
    layers::rope::rope_from_config,
    layers::short_conv::ShortConvSpec,
    layers::{Activation, AttentionShape, QkNormOver, Rope},
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
}

/// Where a block's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormLayout {
    /// `h = x + attn(norm(x)); h + mlp(norm(h))` (Llama, Qwen, Mistral, Phi-3).
    PreNorm,
    /// Also a norm on each sublayer's output before the residual add (Gemma 3).
    Sandwich,
    /// [`NormLayout::Sandwich`] with Gemma 3n's low-rank residual (`laurel`) beside attention:
    /// `h = (x + norm(attn(n)) + laurel(n)) / sqrt(2)` with `n = norm(x)`, then the MLP as in
    /// a sandwich.
    SandwichLaurel,
    /// Only the norms on the sublayers' outputs: `h = x + norm(attn(x)); h + norm(mlp(h))`
    /// (OLMo 2).
    PostNorm,
    /// One norm feeding attention and MLP side by side: `h = norm(x); attn(h) + mlp(h) + x`
    /// (Cohere).
    Parallel,
    /// One norm (`norm`) before the block's one sublayer, its mixer or (where it has none) its
    /// MLP: `x + sublayer(norm(x))` (Nemotron-H).
    Single,
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
    /// Kimi Delta Attention (`self_attn`, Kimi Linear's linear layers): the layer's `shape`,
    /// `rope` and `qk_norm` do not apply.
    KimiDelta(KdaSpec),
    /// Multi-head latent attention (`self_attn`, DeepSeek-V3's MLA): a cache of compressed
    /// latents, the layer's `shape`, `rope` and `qk_norm` do not apply (its spec has its own).
    Latent(MlaSpec),
    /// A gated short convolution with a cache of its last inputs (`conv`, LFM2's other
    /// layers): the layer's `shape`, `rope` and `qk_norm` do not apply.
    ShortConv(ShortConvSpec),
    /// A Mamba state-space layer (the first; `mamba`, the checkpoint's `mixer`): the layer's
    /// `shape`, `rope` and `qk_norm` do not apply.
    Mamba(MambaSpec),
    /// A Mamba2 state-space layer with its convolution window and state cached (`mamba`,
    /// Nemotron-H's and Granite 4.0's): the layer's `shape`, `rope` and `qk_norm` do not apply.
    Mamba2(Mamba2Spec),
    /// Softmax attention (`self_attn`, as [`AttentionKind::Softmax`] without an output gate)
    /// and a Mamba2 layer (`mamba`) side by side on one norm, `x + mamba + attn` (Falcon-H1);
    /// their caches go together ([`KvCache::Pair`](crate::layers::kv_cache::KvCache::Pair)).
    SoftmaxAndMamba2(Mamba2Spec),
    /// No mixer: an MLP-only block (Nemotron-H's; with [`NormLayout::Single`]). Its cache only
    /// counts positions.
    None,
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
    /// `mlp.{up,down}_proj`, no gate: `down(act(up(x)))` (Nemotron-H, with `relu(x)²`).
    Ungated,
    /// No MLP: a mixer-only block (Nemotron-H's; with [`NormLayout::Single`]).
    None,
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
            kv_from: None,
        }
    }

    /// A block of one sublayer ([`NormLayout::Single`]), `attention` or `mlp` (the other
    /// [`AttentionKind::None`] / [`MlpSpec::None`]), without positions; `shape` is read by
    /// softmax attention only (Nemotron-H, Mamba2).
    pub fn single(
        rms_norm_eps: f32,
        shape: AttentionShape,
        attention: AttentionKind,
        mlp: MlpSpec,
        activation: Activation,
    ) -> Self {
        Self {
            attention,
            fused: false,
            qk_norm: None,
            norms: NormLayout::Single,
            activation,
            mlp,
            rms_norm_eps,
            shape,
            rope: None,
            sinks: false,
            values_from_keys: false,
            v_norm: false,
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
