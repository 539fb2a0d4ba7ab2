//! Falcon-H1 (`falcon_h1`, mlx-lm's `falcon_h1.py`): every layer runs a Mamba2 state-space layer
//! (`mamba`, `layers::mamba2`: gated only, or with `mamba_rms_norm` an RMS norm over every head,
//! before or after the gate) and attention (`self_attn`, RoPE) side by side on one pre-norm,
//! `x + mamba + attn`, then a SwiGLU MLP (`feed_forward`) on its own pre-norm
//! (`pre_ff_layernorm`). Their caches go together (`KvCache::Pair`: keys and values, then the
//! state).
//!
//! Hugging Face checkpoints keep Falcon-H1's muP multipliers apart; mlx-lm's sanitize folds them
//! into the weights (only the `weight` tensors, in their dtype) when it sees Hugging Face's
//! convolution layout, and so does [`fold_multipliers`]. A tied head's logits are scaled by
//! `lm_head_multiplier / embedding_multiplier` whatever the layout.

use mlx_rs::{ops, Array};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mamba2::{GatedNorm, Mamba2Spec},
    layers::weights::Weights,
    layers::{self, scalar_like, AttentionShape},
    models::{
        decoder::{sanitize, AttentionKind, CommonArgs, Decoder, DecoderSpec, Family},
        model::parse_args,
    },
};

/// Falcon-H1's parts under the decoder's names, (checkpoint's, ours).
const NAMES: [(&str, &str); 3] = [
    ("feed_forward", "mlp"),
    ("pre_ff_layernorm", "post_attention_layernorm"),
    ("final_layernorm", "norm"),
];

/// mlx-lm's falcon_h1 `ModelArgs`, with its defaults (Falcon-H1-0.5B's). The multipliers are
/// Python floats (doubles), rounded to float32 where MLX takes them, as Python's are.
/// (`key_multiplier` is not read: mlx-lm folds it into `key_proj`, which no checkpoint has.)
#[derive(Debug, Deserialize)]
#[serde(default)]
struct Args {
    attention_in_multiplier: f64,
    attention_out_multiplier: f64,
    embedding_multiplier: f64,
    head_dim: i32,
    hidden_size: i32,
    lm_head_multiplier: f64,
    mamba_d_conv: i32,
    mamba_d_head: i32,
    mamba_d_ssm: i32,
    mamba_d_state: i32,
    mamba_n_groups: i32,
    mamba_n_heads: i32,
    mamba_norm_before_gate: bool,
    mamba_rms_norm: bool,
    max_position_embeddings: usize,
    mlp_multipliers: Vec<f64>,
    num_attention_heads: i32,
    num_hidden_layers: usize,
    num_key_value_heads: i32,
    rms_norm_eps: f32,
    rope_traditional: bool,
    rope_scaling: Option<Value>,
    rope_theta: f32,
    ssm_in_multiplier: f64,
    ssm_multipliers: Vec<f64>,
    ssm_out_multiplier: f64,
    tie_word_embeddings: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            attention_in_multiplier: 1.0,
            attention_out_multiplier: 0.9375,
            embedding_multiplier: 5.656854249492381,
            head_dim: 64,
            hidden_size: 1024,
            lm_head_multiplier: 0.0390625,
            mamba_d_conv: 4,
            mamba_d_head: 64,
            mamba_d_ssm: 1536,
            mamba_d_state: 128,
            mamba_n_groups: 1,
            mamba_n_heads: 24,
            mamba_norm_before_gate: false,
            mamba_rms_norm: false,
            max_position_embeddings: 131072,
            mlp_multipliers: vec![0.8838834764831844, 0.5859375],
            num_attention_heads: 8,
            num_hidden_layers: 36,
            num_key_value_heads: 2,
            rms_norm_eps: 1e-5,
            rope_traditional: false,
            rope_scaling: None,
            rope_theta: 100000000000.0,
            ssm_in_multiplier: 1.25,
            ssm_multipliers: vec![
                0.3535533905932738,
                0.25,
                0.3535533905932738,
                0.5,
                0.3535533905932738,
            ],
            ssm_out_multiplier: 0.23570226039551587,
            tie_word_embeddings: true,
        }
    }
}

/// A tied head's logit scale.
pub struct FalconH1 {
    logit_scale: Option<f32>,
}

impl Family for FalconH1 {
    fn logits(&self, logits: Array) -> layers::Result<Array> {
        match self.logit_scale {
            Some(s) => logits.multiply(scalar_like(s, &logits)?),
            None => Ok(logits),
        }
    }
}

fn invalid(detail: String) -> EngineError {
    EngineError::load(LoadErrorKind::InvalidWeights, detail)
}

/// mlx-lm's sanitize for a Hugging Face checkpoint: each multiplier folded into its weights (in
/// their dtype), the input projection's rows by part (`ssm_in_multiplier` times the muP
/// vector: gate, x, B, C, time steps).
fn fold_multipliers(weights: &mut Weights, args: &Args) -> Result<(), EngineError> {
    let mlp = |i: usize| {
        args.mlp_multipliers
            .get(i)
            .map(|&m| m as f32)
            .ok_or_else(|| invalid("config.json: `mlp_multipliers` needs two values".to_owned()))
    };
    let rules: [(&str, f32); 7] = [
        ("embed_tokens.weight", args.embedding_multiplier as f32),
        ("lm_head.weight", args.lm_head_multiplier as f32),
        ("o_proj.weight", args.attention_out_multiplier as f32),
        ("out_proj.weight", args.ssm_out_multiplier as f32),
        ("gate_proj.weight", mlp(0)?),
        ("down_proj.weight", mlp(1)?),
        ("q_proj.weight", args.attention_in_multiplier as f32),
    ];
    let names: Vec<String> = weights.names().cloned().collect();
    let groups = args.mamba_n_groups * args.mamba_d_state;
    let sizes = [
        args.mamba_d_ssm,
        args.mamba_d_ssm,
        groups,
        groups,
        args.mamba_n_heads,
    ];
    if args.ssm_multipliers.len() != sizes.len() {
        return Err(invalid(
            "config.json: `ssm_multipliers` needs five values".to_owned(),
        ));
    }
    let err = |name: &str, e: mlx_rs::error::Exception| invalid(format!("`{name}`: {e}"));
    for name in names {
        let factor = if name.ends_with("k_proj.weight") {
            Some(args.attention_in_multiplier as f32)
        } else {
            rules
                .iter()
                .find(|(end, _)| name.ends_with(end))
                .map(|r| r.1)
        };
        if let Some(f) = factor {
            let w = weights.take(&name)?;
            let folded = scalar_like(f, &w).and_then(|f| w.multiply(f));
            weights.insert(name.clone(), folded.map_err(|e| err(&name, e))?);
        } else if name.ends_with("in_proj.weight") {
            let w = weights.take(&name)?;
            let parts = (sizes.iter().zip(&args.ssm_multipliers))
                .map(|(&n, &m)| ops::full::<f32>(&[n], Array::from_f32(m as f32)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err(&name, e))?;
            let folded = ops::concatenate(&parts, 0)
                .and_then(|mup| mup.as_dtype(w.dtype()))
                .and_then(|mup| scalar_like(args.ssm_in_multiplier as f32, &mup)?.multiply(mup))
                .and_then(|factor| w.multiply(factor.expand_dims(-1)?));
            weights.insert(name.clone(), folded.map_err(|e| err(&name, e))?);
        }
    }
    Ok(())
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder<FalconH1>, EngineError> {
    let args: Args = parse_args(config)?;
    if args.mamba_d_ssm != args.mamba_n_heads * args.mamba_d_head {
        return Err(invalid(format!(
            "config.json: `mamba_d_ssm` {} is not `mamba_n_heads` x `mamba_d_head` ({} x {})",
            args.mamba_d_ssm, args.mamba_n_heads, args.mamba_d_head
        )));
    }
    let c = CommonArgs {
        hidden_size: args.hidden_size,
        num_hidden_layers: args.num_hidden_layers,
        num_attention_heads: args.num_attention_heads,
        num_key_value_heads: Some(args.num_key_value_heads),
        rms_norm_eps: args.rms_norm_eps,
        rope_scaling: args.rope_scaling.clone(),
    };
    let max_pos = Some(args.max_position_embeddings);
    let rope = c.rope(
        args.head_dim,
        args.rope_theta,
        args.rope_traditional,
        max_pos,
    )?;
    let mamba = Mamba2Spec {
        num_heads: args.mamba_n_heads,
        head_dim: args.mamba_d_head,
        n_groups: args.mamba_n_groups,
        state_size: args.mamba_d_state,
        conv_kernel: args.mamba_d_conv,
        norm_eps: args.rms_norm_eps,
        norm: match (args.mamba_rms_norm, args.mamba_norm_before_gate) {
            (false, _) => GatedNorm::GateOnly,
            (true, false) => GatedNorm::Whole,
            (true, true) => GatedNorm::WholeThenGate,
        },
        time_step_limit: (0.0, f32::INFINITY),
        d_as_stored: true,
    };
    let layer = crate::models::decoder::LayerSpec {
        attention: AttentionKind::SoftmaxAndMamba2(mamba),
        shape: AttentionShape::new(
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
            args.head_dim as f64,
        ),
        ..c.llama_layer(args.head_dim, rope)
    };
    // mlx-lm folds the multipliers only into a checkpoint in Hugging Face's layout.
    let conv = weights.shape("model.layers.0.mamba.conv1d.weight");
    if conv.is_some_and(|s| s.len() == 3 && s[2] > s[1]) {
        fold_multipliers(&mut weights, &args)?;
    }
    weights.rename_parts(&NAMES);
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec::uniform(
        layer,
        c.num_hidden_layers,
        args.tie_word_embeddings,
        max_pos,
    );
    let family = FalconH1 {
        logit_scale: (args.tie_word_embeddings)
            .then(|| (args.lm_head_multiplier / args.embedding_multiplier) as f32),
    };
    Decoder::load(weights, spec, family)
}
