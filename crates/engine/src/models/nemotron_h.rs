//! Nemotron-H (NVIDIA Nemotron-H, Nemotron Nano 2 and 3), as mlx-lm's `nemotron_h.py` runs it:
//! a stack of one-sublayer blocks (`norm`, then one mixer, plus the residual), each a Mamba2
//! state-space layer (`M`, `layers::mamba2`, norm per group), attention without positions
//! (`*`), a `relu(x)²` MLP (`-`) or a mixture of `relu(x)²` experts (`E`: DeepSeek's grouped
//! sigmoid router with a correction bias, a shared expert, optionally run in a smaller latent
//! width: Nemotron 3 Super's `moe_latent_size`), as `hybrid_override_pattern` (or `layers_block_type`) lists them.
//!
//! Checkpoints keep every block's sublayer under `mixer` and the model under `backbone`
//! (`embeddings`, `norm_f`): renamed at load for the shared decoder, the names recorded
//! (`Weights::rename_parts`) for per-layer quantization and adapters. The multi-token
//! prediction layers (`mtp.*`) are dropped, as mlx-lm does.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mamba2::{self, GatedNorm, Mamba2Spec},
    layers::moe::{MoeSpec, Routing},
    layers::weights::Weights,
    layers::{Activation, AttentionShape},
    models::{
        decoder::{AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        model::parse_args,
    },
};

/// The model's parts under the decoder's names, (checkpoint's, ours).
/// (The whole paths first: renamed in order, named back in order.)
const NAMES: [(&str, &str); 5] = [
    ("backbone.embeddings", "model.embed_tokens"),
    ("backbone.norm_f", "model.norm"),
    ("backbone", "model"),
    ("switch_mlp.fc1", "switch_mlp.up_proj"),
    ("switch_mlp.fc2", "switch_mlp.down_proj"),
];

/// mlx-lm's nemotron_h `ModelArgs` (the fields it reads).
#[derive(Debug, Deserialize)]
struct Args {
    hidden_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    head_dim: Option<i32>,
    max_position_embeddings: Option<usize>,
    mamba_num_heads: i32,
    mamba_head_dim: i32,
    ssm_state_size: i32,
    conv_kernel: i32,
    n_groups: i32,
    layer_norm_epsilon: f32,
    hybrid_override_pattern: Option<Value>,
    layers_block_type: Option<Vec<String>>,
    layer_types: Option<Vec<String>>,
    time_step_limit: Option<Vec<Value>>,
    n_routed_experts: Option<i32>,
    num_experts_per_tok: Option<i32>,
    n_shared_experts: Option<i32>,
    n_group: Option<i32>,
    topk_group: Option<i32>,
    norm_topk_prob: Option<bool>,
    routed_scaling_factor: Option<f32>,
    moe_latent_size: Option<i32>,
}

/// A block's one sublayer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Mamba,
    Attention,
    Mlp,
    Experts,
}

impl Block {
    fn from_char(c: char) -> Option<Self> {
        match c {
            'M' => Some(Self::Mamba),
            '*' => Some(Self::Attention),
            '-' => Some(Self::Mlp),
            'E' => Some(Self::Experts),
            _ => None,
        }
    }

    /// transformers' names (`layers_block_type`), legacy ones included, as mlx-lm maps them.
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "mamba" | "linear_attention" | "conv" => Some(Self::Mamba),
            "attention" | "full_attention" => Some(Self::Attention),
            "mlp" => Some(Self::Mlp),
            "moe" => Some(Self::Experts),
            _ => None,
        }
    }

    /// The decoder's name for the block's `mixer`.
    fn part(self) -> &'static str {
        match self {
            Self::Mamba => "mamba",
            Self::Attention => "self_attn",
            Self::Mlp | Self::Experts => "mlp",
        }
    }
}

fn invalid(detail: String) -> EngineError {
    EngineError::load(LoadErrorKind::InvalidWeights, detail)
}

/// The blocks, from `hybrid_override_pattern` (a string or a list of one-letter strings) or
/// else `layers_block_type` / `layer_types`.
fn blocks(args: &Args) -> Result<Vec<Block>, EngineError> {
    let letters: Option<String> = match &args.hybrid_override_pattern {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(items)) => Some(items.iter().filter_map(Value::as_str).collect()),
        Some(other) => {
            return Err(invalid(format!(
                "config.json: `hybrid_override_pattern` is {other}, not a string of M, *, - and E"
            )))
        }
        None => None,
    };
    if let Some(letters) = letters {
        return (letters.chars())
            .map(|c| {
                Block::from_char(c).ok_or_else(|| {
                    invalid(format!(
                        "config.json: `hybrid_override_pattern` has `{c}`; blocks are M \
                         (Mamba2), * (attention), - (MLP) and E (experts)"
                    ))
                })
            })
            .collect();
    }
    let names = (args.layers_block_type.as_ref()).or(args.layer_types.as_ref());
    let names = names.ok_or_else(|| {
        invalid(
            "config.json: nemotron_h needs `hybrid_override_pattern` or `layers_block_type` to \
             list its blocks"
                .to_owned(),
        )
    })?;
    (names.iter())
        .map(|n| {
            Block::from_name(n).ok_or_else(|| {
                invalid(format!(
                    "config.json: block type `{n}` is unknown (mamba, attention, mlp or moe)"
                ))
            })
        })
        .collect()
}

/// `time_step_limit`, `(0, inf)` when absent.
fn time_step_limit(args: &Args) -> Result<(f32, f32), EngineError> {
    mamba2::time_step_limit(args.time_step_limit.as_deref(), (0.0, f32::INFINITY))
}

fn moe_spec(args: &Args) -> Result<MoeSpec, EngineError> {
    let missing = |field: &str| invalid(format!("config.json: nemotron_h experts need `{field}`"));
    let experts = args
        .n_routed_experts
        .ok_or_else(|| missing("n_routed_experts"))?;
    let top_k = args
        .num_experts_per_tok
        .ok_or_else(|| missing("num_experts_per_tok"))?;
    let scaling = (args.routed_scaling_factor).ok_or_else(|| missing("routed_scaling_factor"))?;
    let routing = Routing::GroupedSigmoid {
        n_group: args.n_group.unwrap_or(1),
        topk_group: args.topk_group.unwrap_or(1),
        norm_topk_prob: args.norm_topk_prob.unwrap_or(false),
        scaling,
        sum_epsilon: Some(1e-20),
    };
    Ok(MoeSpec {
        activation: Activation::Relu2,
        latent: args.moe_latent_size.is_some(),
        ..MoeSpec::deepseek(experts, top_k, routing, args.n_shared_experts.is_some())
    })
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let blocks = blocks(&args)?;
    let head_dim = args
        .head_dim
        .unwrap_or(args.hidden_size / args.num_attention_heads);
    let (heads, kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
    let shape = AttentionShape::new(heads, kv_heads, head_dim, head_dim as f64);
    let eps = args.layer_norm_epsilon;
    let mamba = Mamba2Spec {
        num_heads: args.mamba_num_heads,
        head_dim: args.mamba_head_dim,
        n_groups: args.n_groups,
        state_size: args.ssm_state_size,
        conv_kernel: args.conv_kernel,
        norm_eps: eps,
        norm: GatedNorm::PerGroup,
        time_step_limit: time_step_limit(&args)?,
        d_as_stored: false,
    };
    let experts = match blocks.contains(&Block::Experts) {
        true => Some(moe_spec(&args)?),
        false => None,
    };
    let layers = (blocks.iter())
        .map(|block| {
            let (attention, mlp) = match block {
                Block::Mamba => (AttentionKind::Mamba2(mamba.clone()), MlpSpec::None),
                Block::Attention => (AttentionKind::Softmax { output_gate: false }, MlpSpec::None),
                Block::Mlp => (AttentionKind::None, MlpSpec::Ungated),
                Block::Experts => (
                    AttentionKind::None,
                    MlpSpec::Moe(experts.clone().expect("made where a block has experts")),
                ),
            };
            LayerSpec::single(eps, shape.clone(), attention, mlp, Activation::Relu2)
        })
        .collect();
    weights.drop_prefixed("mtp.");
    let mut names: Vec<(String, String)> = (NAMES.iter())
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    for (i, block) in blocks.iter().enumerate() {
        names.push((
            format!("layers.{i}.mixer"),
            format!("layers.{i}.{}", block.part()),
        ));
    }
    let names: Vec<(&str, &str)> = names
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    weights.rename_parts(&names);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: eps,
        tie_word_embeddings: false,
        max_position_embeddings: args.max_position_embeddings,
    };
    Decoder::load(weights, spec, Llama)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(fields: Value) -> Args {
        let mut config = serde_json::json!({
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16,
            "conv_kernel": 4, "n_groups": 2, "layer_norm_epsilon": 1e-5,
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        parse_args(&config).unwrap()
    }

    #[test]
    fn blocks_come_from_the_pattern_string_or_list_or_transformers_names() {
        use Block::*;
        let want = vec![Mamba, Mlp, Attention, Experts];
        let pattern = args(serde_json::json!({"hybrid_override_pattern": "M-*E"}));
        assert_eq!(blocks(&pattern).unwrap(), want);
        let list = args(serde_json::json!({"hybrid_override_pattern": ["M", "-", "*", "E"]}));
        assert_eq!(blocks(&list).unwrap(), want);
        let names = ["mamba", "mlp", "attention", "moe"];
        let named = args(serde_json::json!({ "layers_block_type": names }));
        assert_eq!(blocks(&named).unwrap(), want);
        let bad = args(serde_json::json!({"hybrid_override_pattern": "M-X"}));
        let err = blocks(&bad).unwrap_err().to_string();
        assert!(err.contains("`X`") && err.contains("M (Mamba2)"), "{err}");
        let none = blocks(&args(serde_json::json!({})))
            .unwrap_err()
            .to_string();
        assert!(none.contains("hybrid_override_pattern"), "{none}");
    }

    #[test]
    fn the_time_step_limit_reads_python_infinity() {
        let absent = args(serde_json::json!({}));
        assert_eq!(time_step_limit(&absent).unwrap(), (0.0, f32::INFINITY));
        let given = args(serde_json::json!({"time_step_limit": [0.001, "Infinity"]}));
        assert_eq!(time_step_limit(&given).unwrap(), (0.001, f32::INFINITY));
        let bad = args(serde_json::json!({"time_step_limit": [1.0]}));
        assert!(time_step_limit(&bad).is_err());
    }
}
