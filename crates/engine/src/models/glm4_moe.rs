//! GLM-4-MoE (GLM-4.5, GLM-4.5-Air): Llama-shaped attention (q/k/v biases when
//! `attention_bias`, q/k norms per head when `use_qk_norm`, RoPE over the first
//! `partial_rotary_factor` of each head, plain whatever `rope_scaling` says in mlx-lm) and, from
//! layer `first_k_dense_replace` on, a sparse MoE with `n_shared_experts` shared experts (one
//! MLP, ungated) whose router picks experts by sigmoid scores plus a correction bias within the
//! best groups (`moe::Routing::GroupedSigmoid`). The head is never tied. A checkpoint's extra
//! layer `num_hidden_layers` (multi-token prediction) is not used.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        model::parse_args,
    },
};

#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    rope_theta: f32,
    partial_rotary_factor: f64,
    max_position_embeddings: usize,
    use_qk_norm: bool,
    n_routed_experts: Option<i32>,
    num_experts_per_tok: i32,
    n_group: i32,
    topk_group: i32,
    n_shared_experts: Option<i32>,
    routed_scaling_factor: f32,
    norm_topk_prob: bool,
    first_k_dense_replace: usize,
    #[serde(default = "noaux_tc")]
    topk_method: String,
}

fn noaux_tc() -> String {
    "noaux_tc".into()
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    if args.topk_method != "noaux_tc" {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "glm4_moe: topk_method `{}` is not supported (mlx-lm runs `noaux_tc` only)",
                args.topk_method
            ),
        ));
    }
    c.refuse_rope_scaling("glm4_moe")?;
    let max_pos = Some(args.max_position_embeddings);
    // mlx-lm: `int(head_dim * partial_rotary_factor)` features rotated.
    let rotary = (args.head_dim as f64 * args.partial_rotary_factor) as i32;
    let rope = c.rope(rotary, args.rope_theta, false, max_pos)?;
    let layer = LayerSpec {
        qk_norm: args.use_qk_norm.then_some(QkNormOver::Head),
        ..c.llama_layer(args.head_dim, rope)
    };
    let n = c.num_hidden_layers;
    let mut spec = DecoderSpec::uniform(layer, n, false, max_pos);
    if let Some(experts) = args.n_routed_experts {
        let routing = Routing::GroupedSigmoid {
            n_group: args.n_group,
            topk_group: args.topk_group,
            norm_topk_prob: args.norm_topk_prob,
            scaling: args.routed_scaling_factor,
            sum_epsilon: None,
        };
        let shared = args.n_shared_experts.is_some();
        let moe = MoeSpec::deepseek(experts, args.num_experts_per_tok, routing, shared);
        for layer in spec.layers.iter_mut().skip(args.first_k_dense_replace) {
            layer.mlp = MlpSpec::Moe(moe.clone());
        }
    }
    let mtp = format!("model.layers.{n}.");
    let extra: Vec<String> = weights
        .names()
        .filter(|name| name.starts_with(&mtp))
        .cloned()
        .collect();
    for name in extra {
        weights.remove(&name);
    }
    sanitize(&mut weights, false);
    Decoder::load(weights, spec, Llama)
}
