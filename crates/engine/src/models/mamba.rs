//! Mamba (`mamba`, mlx-lm's `mamba.py`: the state-spaces Mamba releases; Falcon Mamba's
//! `falcon_mamba`, which mlx-lm runs as it with the time steps, `B` and `C` RMS-normalised):
//! blocks of one sublayer, `x + mixer(norm(x))`, each a Mamba layer (`layers::mamba`); every
//! norm at MLX's default 1e-5, as mlx-lm builds them. The checkpoint's `backbone`,
//! `embeddings`, `norm_f` and `mixer` are renamed at load with a record.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::mamba::MambaSpec,
    layers::weights::Weights,
    layers::{Activation, AttentionShape},
    models::{
        decoder::{sanitize, AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        mamba2::NAMES,
        model::parse_args,
    },
};

/// Every norm's epsilon (`nn.RMSNorm(hidden_size)`: MLX's default).
const NORM_EPS: f32 = 1e-5;

/// mlx-lm's mamba `ModelArgs` (the fields it reads, its defaults).
#[derive(Debug, Deserialize)]
struct Args {
    model_type: String,
    hidden_size: i32,
    intermediate_size: i32,
    state_size: i32,
    num_hidden_layers: usize,
    conv_kernel: i32,
    /// A number, or `"auto"`: `ceil(hidden_size / 16)`.
    time_step_rank: Value,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(default)]
    use_bcdt_rms: bool,
    #[serde(default = "default_mixer_rms_eps")]
    mixer_rms_eps: f32,
}

fn yes() -> bool {
    true
}

fn default_mixer_rms_eps() -> f32 {
    1e-6
}

/// `mamba` or `falcon_mamba`.
pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let rank = match &args.time_step_rank {
        Value::String(s) if s == "auto" => (args.hidden_size + 15) / 16,
        v => v.as_i64().map(|n| n as i32).ok_or_else(|| {
            EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!("config.json: time_step_rank is {v}, not a number or \"auto\""),
            )
        })?,
    };
    let bcdt = args.use_bcdt_rms || args.model_type == "falcon_mamba";
    let mamba = MambaSpec {
        intermediate_size: args.intermediate_size,
        state_size: args.state_size,
        conv_kernel: args.conv_kernel,
        time_step_rank: rank,
        bcdt_norm_eps: bcdt.then_some(args.mixer_rms_eps),
    };
    // No attention: the shape is never read.
    let shape = AttentionShape::new(1, 1, args.hidden_size, args.hidden_size as f64);
    let attention = AttentionKind::Mamba(mamba);
    let layer = LayerSpec::single(NORM_EPS, shape, attention, MlpSpec::None, Activation::Silu);
    weights.rename_parts(&NAMES);
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers: vec![layer; args.num_hidden_layers],
        rms_norm_eps: NORM_EPS,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: None,
    };
    Decoder::load(weights, spec, Llama)
}
