//! `llama4_text` as mlx-lm's llama4_text.py runs it (MobileLLM-R1's dense layout, not Llama 4's
//! language model, which is `llama4.rs`): Llama's layers with traditional plain RoPE in the
//! layers `no_rope_layers` marks 1 (none in the others), queries and keys RMS-normed per head
//! without a scale before RoPE (`use_qk_norm`, at `rms_norm_eps`), a dense MLP everywhere
//! (`feed_forward`, `intermediate_size_mlp`) and an untied head named `output` ([`NAMES`]).

use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::QkNormOver,
    models::{
        decoder::{sanitize, CommonArgs, Decoder, DecoderSpec, Llama},
        model::parse_args,
    },
};

/// The checkpoint's names for the shared decoder's parts: (its, the decoder's).
const NAMES: [(&str, &str); 2] = [("feed_forward", "mlp"), ("output", "lm_head")];

/// mlx-lm's llama4_text `ModelArgs`: every field required.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    head_dim: i32,
    rope_theta: f32,
    tie_word_embeddings: bool,
    no_rope_layers: Vec<i64>,
    use_qk_norm: bool,
}

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    let n = c.num_hidden_layers;
    if args.no_rope_layers.len() < n {
        return Err(EngineError::load(
            LoadErrorKind::InvalidWeights,
            format!(
                "config.json: llama4_text `no_rope_layers` lists {} layers but \
                 `num_hidden_layers` is {n}",
                args.no_rope_layers.len()
            ),
        ));
    }
    // mlx-lm's `nn.RoPE` here: plain whatever `rope_scaling` says.
    c.refuse_rope_scaling("llama4_text")?;
    let rope = c.rope(args.head_dim, args.rope_theta, true, None)?;
    let layers = (0..n)
        .map(|i| {
            let mut layer = c.llama_layer(args.head_dim, rope.clone());
            layer.qk_norm = args.use_qk_norm.then_some(QkNormOver::Unscaled {
                eps: c.rms_norm_eps,
                after_rope: false,
            });
            if args.no_rope_layers[i] == 0 {
                layer.rope = None;
            }
            layer
        })
        .collect();
    weights.rename_parts(&NAMES);
    sanitize(&mut weights, args.tie_word_embeddings);
    let spec = DecoderSpec {
        layers,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: args.tie_word_embeddings,
        max_position_embeddings: None,
    };
    Decoder::load(weights, spec, Llama)
}
