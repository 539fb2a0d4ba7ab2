//! Mamba2 alone (`mamba2`, mlx-lm's `mamba2.py`: Mamba-Codestral, the state-spaces Mamba2
//! releases): blocks of one sublayer, `x + mixer(norm(x))`, each a Mamba2 layer
//! (`layers::mamba2`: the gated output RMS-normed over every head, `D` in its stored dtype);
//! the blocks' norms at mlx-lm's default 1e-5, the final one at `layer_norm_epsilon`. The
//! checkpoint's `backbone`, `embeddings`, `norm_f` and `mixer` are renamed at load with a record.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::EngineError,
    layers::mamba2::{self, GatedNorm, Mamba2Spec},
    layers::weights::Weights,
    layers::{Activation, AttentionShape},
    models::{
        decoder::{sanitize, AttentionKind, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        model::parse_args,
    },
};

/// The model's parts under the decoder's names, (checkpoint's, ours); whole paths first (Mamba's
/// too).
pub(super) const NAMES: [(&str, &str); 4] = [
    ("backbone.embeddings", "model.embed_tokens"),
    ("backbone.norm_f", "model.norm"),
    ("backbone", "model"),
    ("mixer", "mamba"),
];

/// The blocks' norm (`nn.RMSNorm(hidden_size)`: MLX's default epsilon).
const BLOCK_NORM_EPS: f32 = 1e-5;

/// mlx-lm's mamba2 `ModelArgs` (the fields it reads).
#[derive(Debug, Deserialize)]
struct Args {
    num_heads: i32,
    head_dim: i32,
    hidden_size: i32,
    state_size: i32,
    ssm_state_size: Option<i32>,
    num_hidden_layers: usize,
    layer_norm_epsilon: f32,
    conv_kernel: i32,
    n_groups: i32,
    tie_word_embeddings: bool,
    time_step_limit: Vec<Value>,
    #[serde(default = "default_max_position")]
    max_position_embeddings: usize,
}

fn default_max_position() -> usize {
    2056
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    // Required here: mlx-lm's `ModelArgs` has no default.
    let limit = mamba2::time_step_limit(Some(&args.time_step_limit), (0.0, 0.0))?;
    let mamba = Mamba2Spec {
        num_heads: args.num_heads,
        head_dim: args.head_dim,
        n_groups: args.n_groups,
        state_size: args.ssm_state_size.unwrap_or(args.state_size),
        conv_kernel: args.conv_kernel,
        norm_eps: args.layer_norm_epsilon,
        norm: GatedNorm::Whole,
        time_step_limit: limit,
        d_as_stored: true,
    };
    // No attention: the shape is never read.
    let shape = AttentionShape::new(1, 1, args.hidden_size, args.hidden_size as f64);
    let attention = AttentionKind::Mamba2(mamba);
    let layer = LayerSpec::single(
        BLOCK_NORM_EPS,
        shape,
        attention,
        MlpSpec::None,
        Activation::Silu,
    );
    weights.rename_parts(&NAMES);
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers: vec![layer; args.num_hidden_layers],
        rms_norm_eps: args.layer_norm_epsilon,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: Some(args.max_position_embeddings),
    };
    Decoder::load(weights, spec, Llama)
}
