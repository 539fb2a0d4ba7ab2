//! GPT-OSS: attention with biases and learned sinks (one logit per head that joins each
//! softmax), layers alternating between sliding-window and full attention (`layer_types`,
//! default sliding first), RoPE as `rope_scaling` asks (YaRN in the released models), and a
//! sparse mixture of experts in every layer: router `router` with a bias, top k of its logits,
//! softmax over those k, experts with biases and the clamped SwiGLU (alpha 1.702, limit 7).
//!
//! Checkpoints come in two layouts: mlx-lm's (experts stacked under `mlp.experts.*_proj`) and
//! OpenAI's (`gate_up_proj` with gate and up rows interleaved, MXFP4 `_blocks`/`_scales`),
//! which [`sanitize`] turns into the first as mlx-lm's `sanitize` does.

use mlx_rs::Array;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::moe::{MoeSpec, Routing, PROJECTIONS},
    layers::weights::Weights,
    layers::Activation,
    models::{
        decoder::{CommonArgs, Decoder, DecoderSpec, LayerSpec, Llama, MlpSpec},
        llama::layer_windows,
        model::parse_args,
    },
};

/// mlx-lm's `ModelArgs` defaults.
#[derive(Debug, Deserialize)]
struct Args {
    #[serde(flatten)]
    common: CommonArgs,
    #[serde(default = "default_head_dim")]
    head_dim: i32,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    #[serde(default = "default_sliding_window")]
    sliding_window: i32,
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_experts")]
    num_local_experts: i32,
    #[serde(default = "default_top_k")]
    num_experts_per_tok: i32,
    swiglu_alpha: Option<f32>,
    swiglu_limit: Option<f32>,
    max_position_embeddings: Option<usize>,
}

fn default_head_dim() -> i32 {
    64
}
fn default_rope_theta() -> f32 {
    150000.0
}
fn default_sliding_window() -> i32 {
    128
}
fn default_experts() -> i32 {
    128
}
fn default_top_k() -> i32 {
    4
}

/// mlx-lm's `SwigluOAI` constants; it reads neither from config.json.
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

pub fn load(config: &Value, mut weights: Weights) -> Result<Decoder, EngineError> {
    let args: Args = parse_args(config)?;
    let c = &args.common;
    // transformers reads `swiglu_alpha`/`swiglu_limit`; mlx-lm does not: other values are
    // refused rather than run as mlx-lm would (with its constants, not the model's).
    let other = |v: Option<f32>, c: f32| v.filter(|v| *v != c);
    if let Some(v) = other(args.swiglu_alpha, ALPHA).or(other(args.swiglu_limit, LIMIT)) {
        return Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!(
                "gpt_oss: `swiglu_alpha` / `swiglu_limit` ({v}) other than {ALPHA} / {LIMIT} are \
                 not supported (mlx-lm runs the experts' SwiGLU with these constants whatever \
                 config.json says)"
            ),
        ));
    }
    let n = c.num_hidden_layers;
    // mlx-lm's default: sliding and full attention alternating, sliding first.
    let types = args.layer_types.clone().unwrap_or_else(|| {
        let pair = ["sliding_attention", "full_attention"].map(String::from);
        pair.iter().cycle().take(n).cloned().collect()
    });
    let windows = layer_windows(Some(&types), Some(args.sliding_window), n, "gpt_oss")?;
    let max_pos = args.max_position_embeddings;
    let rope = c.rope(args.head_dim, args.rope_theta, false, max_pos)?;
    let moe = MoeSpec {
        router: "router",
        stacked: "experts",
        activation: Activation::ClampedSilu {
            alpha: ALPHA,
            limit: LIMIT,
        },
        ..MoeSpec::switch_glu(
            "mlp",
            args.num_local_experts,
            args.num_experts_per_tok,
            Routing::TopKTailSoftmax,
            PROJECTIONS,
        )
    };
    let layer = LayerSpec {
        mlp: MlpSpec::Moe(moe),
        sinks: true,
        ..c.llama_layer(args.head_dim, rope)
    };
    // mlx-lm's model always has its own head (`tie_word_embeddings` is not read).
    let mut spec = DecoderSpec::uniform(layer, n, false, max_pos);
    for (layer, window) in spec.layers.iter_mut().zip(windows) {
        layer.shape.window = window;
    }
    sanitize(&mut weights)?;
    Decoder::load(weights, spec, Llama)
}

/// OpenAI's expert layout in mlx-lm's: `gate_up_proj` (rows alternating gate, up) split into
/// `gate_proj` and `up_proj`, MXFP4 `_blocks` (16 bytes per group of 32) as packed words under
/// `.weight`, `_scales` as `.scales`, `_bias` as `.bias`. A checkpoint already in mlx-lm's
/// layout is left as it is.
fn sanitize(weights: &mut Weights) -> Result<(), EngineError> {
    let openai: Vec<String> = weights
        .names()
        .filter(|n| n.contains(".experts.gate_up_proj") || n.contains(".experts.down_proj_"))
        .cloned()
        .collect();
    for name in openai {
        let tensor = weights.take(&name)?;
        let failed = |e: mlx_rs::error::Exception| {
            EngineError::load(LoadErrorKind::InvalidWeights, format!("`{name}`: {e}"))
        };
        let (base, part, tensor) = if let Some(base) = name.strip_suffix("_blocks") {
            let words = tensor.view::<u32>().and_then(|w| w.flatten(-2, -1));
            (base, "weight", words.map_err(failed)?)
        } else if let Some(base) = name.strip_suffix("_scales") {
            (base, "scales", tensor)
        } else if let Some(base) = name.strip_suffix("_bias") {
            (base, "bias", tensor)
        } else {
            return Err(EngineError::load(
                LoadErrorKind::UnsupportedArchitecture,
                format!(
                    "gpt_oss: `{name}` holds dense experts in transformers' layout, which mlx-lm \
                     does not load; use OpenAI's MXFP4 checkpoint or an mlx-lm conversion"
                ),
            ));
        };
        match base.strip_suffix("gate_up_proj") {
            Some(experts) => {
                // Rows (weights, scales) or entries (biases) alternate gate, up.
                let axis = if part == "bias" { -1 } else { -2 };
                let [gate, up] = deinterleave(&tensor, axis).map_err(failed)?;
                weights.insert(format!("{experts}gate_proj.{part}"), gate);
                weights.insert(format!("{experts}up_proj.{part}"), up);
            }
            None => weights.insert(format!("{base}.{part}"), tensor),
        }
    }
    Ok(())
}

/// `[x[..., ::2, ...], x[..., 1::2, ...]]` along `axis` (negative), each contiguous.
fn deinterleave(x: &Array, axis: i32) -> mlx_rs::error::Result<[Array; 2]> {
    let mut shape = x.shape().to_vec();
    let at = (shape.len() as i32 + axis) as usize;
    let n = shape[at];
    shape.splice(at..=at, [n / 2, 2]);
    let pairs = x.reshape(&shape)?;
    let mut halves = pairs.split_equal(2, at as i32 + 1)?.into_iter();
    let mut next = || -> mlx_rs::error::Result<Array> {
        let half = halves.next().expect("split in two");
        half.squeeze_axes(&[at as i32 + 1])?.contiguous()
    };
    Ok([next()?, next()?])
}

#[cfg(test)]
mod tests;
