//! Granite 4.0 hybrids (`granitemoehybrid`, mlx-lm's `granitemoehybrid.py`): pre-normed
//! layers, each a Mamba2 state-space layer (`mamba`, `layers::mamba2`, one norm over every
//! head) or attention (`self_attn`, scaled by `attention_multiplier`, plain RoPE or none where
//! `position_embedding_type` is `nope`), as `layer_types` lists them; then either a mixture of
//! experts (`block_sparse_moe`: the top k router logits, softmax over them) plus a shared MLP
//! beside it, or a dense MLP. Granite's multipliers: embeddings times `embedding_multiplier`,
//! each sublayer's output times `residual_multiplier` before its residual add, logits divided
//! by `logits_scaling`.
//!
//! Hugging Face stores the experts fused (`input_linear`: gate rows, then up; `output_linear`),
//! and a dense model's MLP as `shared_mlp`: split at load as mlx-lm's sanitize does. The
//! router (`router.layer`) and the shared MLP keep their names through the rename record.

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mamba2::{self, GatedNorm, Mamba2Spec},
    layers::moe::{split_fused_experts, FusedExperts, MoeSpec, Routing, Shared, PROJECTIONS},
    layers::weights::Weights,
    layers::{self, scalar_like, Activation},
    models::{
        decoder::{sanitize, AttentionKind, CommonArgs, Decoder, DecoderSpec, Family, MlpSpec},
        model::parse_args,
    },
};

/// An MoE model's parts under the decoder's names, (checkpoint's, ours).
const MOE_NAMES: [(&str, &str); 3] = [
    ("block_sparse_moe.router.layer", "block_sparse_moe.gate"),
    (
        "shared_mlp.input_linear",
        "block_sparse_moe.shared_expert.gate_up_proj",
    ),
    (
        "shared_mlp.output_linear",
        "block_sparse_moe.shared_expert.down_proj",
    ),
];

/// mlx-lm's granitemoehybrid `ModelArgs` (the fields it reads).
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    max_position_embeddings: usize,
    embedding_multiplier: f32,
    attention_multiplier: f32,
    logits_scaling: f32,
    residual_multiplier: f32,
    layer_types: Vec<String>,
    num_local_experts: Option<i32>,
    num_experts_per_tok: Option<i32>,
    mamba_n_heads: Option<i32>,
    mamba_d_head: Option<i32>,
    mamba_d_state: Option<i32>,
    mamba_d_conv: Option<i32>,
    mamba_n_groups: Option<i32>,
    #[serde(default = "default_position_embedding")]
    position_embedding_type: String,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    time_step_limit: Option<Vec<Value>>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    rope_parameters: Option<Value>,
}

fn default_position_embedding() -> String {
    "rope".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_rope_theta() -> f32 {
    10000.0
}

/// Granite's multipliers around the shared layers.
pub struct GraniteHybrid {
    embedding_multiplier: f32,
    residual_multiplier: f32,
    logits_scaling: f32,
}

impl Family for GraniteHybrid {
    fn scale_embeddings(&self, h: Array) -> layers::Result<Array> {
        h.multiply(scalar_like(self.embedding_multiplier, &h)?)
    }

    /// `x + y * residual_multiplier`.
    fn residual(&self, x: &Array, y: &Array) -> layers::Result<Array> {
        x.add(y.multiply(scalar_like(self.residual_multiplier, y)?)?)
    }

    fn logits(&self, logits: Array) -> layers::Result<Array> {
        logits.divide(scalar_like(self.logits_scaling, &logits)?)
    }
}

fn invalid(detail: String) -> EngineError {
    EngineError::load(LoadErrorKind::InvalidWeights, detail)
}

/// The Mamba2 layers' sizes; `None` for a model without any.
fn mamba_spec(args: &Args) -> Result<Option<Mamba2Spec>, EngineError> {
    if !args.layer_types.iter().any(|t| t == "mamba") {
        return Ok(None);
    }
    let need = |v: Option<i32>, field: &str| {
        v.ok_or_else(|| invalid(format!("config.json: Mamba2 layers need `{field}`")))
    };
    let given = args.time_step_limit.as_deref();
    let time_step_limit = mamba2::time_step_limit(given, (0.001, 100.0))?;
    Ok(Some(Mamba2Spec {
        num_heads: need(args.mamba_n_heads, "mamba_n_heads")?,
        head_dim: need(args.mamba_d_head, "mamba_d_head")?,
        n_groups: need(args.mamba_n_groups, "mamba_n_groups")?,
        state_size: need(args.mamba_d_state, "mamba_d_state")?,
        conv_kernel: need(args.mamba_d_conv, "mamba_d_conv")?,
        norm_eps: args.common.rms_norm_eps,
        norm: GatedNorm::Whole,
        time_step_limit,
        d_as_stored: false,
    }))
}

/// Hugging Face's layouts as mlx-lm's sanitize rewrites them: fused experts split into the
/// stacked `switch_mlp`; a dense model's `shared_mlp` split into `mlp`'s three projections.
fn sanitize_mlps(weights: &mut Weights, layers: usize, moe: bool) -> Result<(), EngineError> {
    if moe {
        weights.sanitize_parts(&[
            (
                "block_sparse_moe.input_linear.weight",
                "block_sparse_moe.experts.gate_up_proj",
            ),
            (
                "block_sparse_moe.output_linear.weight",
                "block_sparse_moe.experts.down_proj",
            ),
        ]);
        return split_fused_experts(weights, FusedExperts::Rows, |p| format!("{p}.switch_mlp"));
    }
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let Some(fused) = weights.remove(&format!("{p}.shared_mlp.input_linear.weight")) else {
            continue;
        };
        let halves = fused
            .split_equal(2, 0)
            .map_err(|e| invalid(format!("`{p}.shared_mlp.input_linear.weight`: {e}")))?;
        for (half, part) in halves.into_iter().zip(["gate_proj", "up_proj"]) {
            weights.insert(format!("{p}.mlp.{part}.weight"), half);
        }
        let down = weights.take(&format!("{p}.shared_mlp.output_linear.weight"))?;
        weights.insert(format!("{p}.mlp.down_proj.weight"), down);
    }
    Ok(())
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<GraniteHybrid>, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    if args.layer_types.len() < c.num_hidden_layers {
        return Err(invalid(format!(
            "config.json: `layer_types` lists {} layers but `num_hidden_layers` is {}",
            args.layer_types.len(),
            c.num_hidden_layers
        )));
    }
    let mamba = mamba_spec(&args)?;
    let moe = args.num_local_experts.is_some_and(|n| n != 0);
    let experts = match moe {
        true => Some(MoeSpec {
            router: "gate",
            shared: Shared::Fused,
            ..MoeSpec::switch_glu(
                "block_sparse_moe",
                args.num_local_experts.unwrap_or(0),
                args.num_experts_per_tok.ok_or_else(|| {
                    invalid("config.json: experts need `num_experts_per_tok`".to_owned())
                })?,
                Routing::TopKTailSoftmax,
                PROJECTIONS,
            )
        }),
        false => None,
    };
    // mlx-lm: `rope_parameters.rope_theta` wins; `rope_scaling` is not read (plain RoPE).
    let theta = (args.rope_parameters.as_ref())
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .map_or(args.rope_theta, |t| t as f32);
    let head_dim = c.default_head_dim();
    let rope = crate::layers::rope::rope_from_config(
        head_dim,
        theta,
        false,
        None,
        Some(args.max_position_embeddings),
    )?;
    let layers = (args.layer_types[..c.num_hidden_layers].iter())
        .map(|kind| {
            let mut layer = c.llama_layer(head_dim, rope.clone());
            layer.shape.scale = args.attention_multiplier;
            if args.position_embedding_type == "nope" {
                layer.rope = None;
            }
            layer.activation = Activation::Silu;
            if let Some(e) = &experts {
                layer.mlp = MlpSpec::Moe(e.clone());
            }
            match (kind.as_str(), &mamba) {
                ("attention", _) => Ok(layer),
                ("mamba", Some(m)) => Ok(crate::models::decoder::LayerSpec {
                    attention: AttentionKind::Mamba2(m.clone()),
                    ..layer
                }),
                (other, _) => Err(invalid(format!(
                    "config.json: layer type `{other}` is unknown (mamba or attention)"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    sanitize_mlps(&mut weights, c.num_hidden_layers, moe)?;
    if moe {
        weights.rename_parts(&MOE_NAMES);
    }
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    let family = GraniteHybrid {
        embedding_multiplier: args.embedding_multiplier,
        residual_multiplier: args.residual_multiplier,
        logits_scaling: args.logits_scaling,
    };
    Decoder::load(weights, spec, family)
}
