//! LFM2 (Liquid AI): a hybrid of gated short convolutions (`conv`, `layers::short_conv`) and,
//! at `full_attn_idxs` (or where `layer_types` says `full_attention`), softmax attention with
//! per-head q/k norms and plain RoPE over whole heads; every layer pre-normed with a SwiGLU MLP
//! (`feed_forward.w1`/`w3`/`w2`). The final norm is `embedding_norm`; the head is the embedding.
//! Checkpoints name parts their own way ([`NAMES`]): renamed at load for the shared decoder
//! (`Weights::rename_parts`, which keeps their names for per-layer quantization and adapters).
//!
//! LFM2-MoE (`lfm2_moe`, mlx-lm's `lfm2_moe.py`): the same layers, the MLP after the first
//! `num_dense_layers` a mixture of experts routed by sigmoid scores, chosen with the layer's
//! `expert_bias` ([`Routing::SigmoidBiasChooses`]); mlx-lm's sanitize names `w1`/`w3`/`w2`
//! `gate_proj`/`up_proj`/`down_proj` (in the experts too), so those are its modules' names.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{MoeSpec, Routing, PROJECTIONS},
    layers::short_conv::ShortConvSpec,
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{
            sanitize, AttentionKind, CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec,
        },
        model::parse_args,
    },
};

/// LFM2's names for the shared decoder's parts: (LFM2's, the decoder's).
const NAMES: [(&str, &str); 9] = [
    ("operator_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("feed_forward.w1", "mlp.gate_proj"),
    ("feed_forward.w3", "mlp.up_proj"),
    ("feed_forward.w2", "mlp.down_proj"),
    ("self_attn.out_proj", "self_attn.o_proj"),
    ("self_attn.q_layernorm", "self_attn.q_norm"),
    ("self_attn.k_layernorm", "self_attn.k_norm"),
    ("embedding_norm", "norm"),
];

/// LFM2-MoE's: as [`NAMES`], the MLP's projections under mlx-lm's names
/// ([`MOE_SANITIZED`]).
const MOE_NAMES: [(&str, &str); 7] = [
    ("operator_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("feed_forward", "mlp"),
    ("self_attn.out_proj", "self_attn.o_proj"),
    ("self_attn.q_layernorm", "self_attn.q_norm"),
    ("self_attn.k_layernorm", "self_attn.k_norm"),
    ("embedding_norm", "norm"),
];

/// What mlx-lm's `lfm2_moe` sanitize renames, dense MLPs and experts alike.
const MOE_SANITIZED: [(&str, &str); 3] =
    [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")];

/// mlx-lm's lfm2 `ModelArgs` (the fields it reads).
#[derive(Debug, Deserialize)]
struct Args {
    hidden_size: i32,
    num_hidden_layers: usize,
    num_attention_heads: i32,
    num_key_value_heads: Option<i32>,
    max_position_embeddings: usize,
    norm_eps: f32,
    #[serde(rename = "conv_L_cache")]
    conv_l_cache: i32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    rope_parameters: Option<Value>,
    full_attn_idxs: Option<Vec<usize>>,
    layer_types: Option<Vec<String>>,
}

/// What `lfm2_moe`'s `ModelArgs` adds.
#[derive(Debug, Deserialize)]
struct MoeArgs {
    num_experts: i32,
    num_experts_per_tok: i32,
    norm_topk_prob: bool,
    use_expert_bias: bool,
    num_dense_layers: usize,
    #[serde(default = "default_scaling")]
    routed_scaling_factor: f32,
}

fn default_scaling() -> f32 {
    1.0
}

fn default_rope_theta() -> f32 {
    1e6
}

/// `lfm2` (`moe` false) or `lfm2_moe`.
pub fn load(config: &Value, mut weights: Weights, moe: bool) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let experts = match moe {
        true => Some(parse_args::<MoeArgs>(config)?),
        false => None,
    };
    // mlx-lm: `rope_parameters.rope_theta` wins over `rope_theta`; nothing else of it is read.
    let theta = (args.rope_parameters.as_ref())
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .map_or(args.rope_theta, |t| t as f32);
    let attention_at: Vec<usize> =
        match (&args.full_attn_idxs, &args.layer_types) {
            (Some(idxs), _) => idxs.clone(),
            (None, Some(types)) => (types.iter().enumerate())
                .filter(|(_, t)| *t == "full_attention")
                .map(|(i, _)| i)
                .collect(),
            (None, None) => return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                "config.json: lfm2 needs `full_attn_idxs` or `layer_types` to say which layers \
                 attend",
            )),
        };
    let c = CommonArgs {
        hidden_size: args.hidden_size,
        num_hidden_layers: args.num_hidden_layers,
        num_attention_heads: args.num_attention_heads,
        num_key_value_heads: args.num_key_value_heads,
        rms_norm_eps: args.norm_eps,
        rope_scaling: None,
    };
    let head_dim = c.default_head_dim();
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(head_dim, theta, false, max_pos)?;
    let conv = ShortConvSpec {
        kernel: args.conv_l_cache,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let layer = LayerSpec {
                qk_norm: Some(QkNormOver::Head),
                ..c.llama_layer(head_dim, rope.clone())
            };
            let layer = match &experts {
                Some(m) if i >= m.num_dense_layers => LayerSpec {
                    mlp: MlpSpec::Moe(moe_spec(m)),
                    ..layer
                },
                _ => layer,
            };
            match attention_at.contains(&i) {
                true => layer,
                false => LayerSpec {
                    attention: AttentionKind::ShortConv(conv),
                    ..layer
                },
            }
        })
        .collect();
    match moe {
        true => {
            weights.sanitize_parts(&MOE_SANITIZED);
            weights.rename_parts(&MOE_NAMES);
        }
        false => weights.rename_parts(&NAMES),
    }
    sanitize(&mut weights, true);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: true,
        max_position_embeddings: max_pos,
    };
    Decoder::load(weights, spec, Llama)
}

/// An LFM2-MoE layer's experts: `feed_forward.gate` and `switch_mlp` (renamed `mlp`).
fn moe_spec(m: &MoeArgs) -> MoeSpec {
    let routing = Routing::SigmoidBiasChooses {
        expert_bias: m.use_expert_bias,
        norm_topk_prob: m.norm_topk_prob,
        scaling: m.routed_scaling_factor,
    };
    MoeSpec::switch_glu(
        "mlp",
        m.num_experts,
        m.num_experts_per_tok,
        routing,
        PROJECTIONS,
    )
}
