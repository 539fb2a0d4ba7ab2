//! The sampler settings of `generate`: each one's wire name, default, range and meaning, in one
//! place. They sit at the top level of `generate`'s params (flattened); the engine's sampler
//! reads this struct as it is, so a new setting is a field here (with its check) and its use in
//! `crates/engine/src/runtime/sampler.rs`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::ResponseError;
use crate::params::with_defaults;

fn default_temperature() -> f64 {
    0.7
}
fn default_top_p() -> f64 {
    0.9
}
fn default_top_k() -> i32 {
    40
}
fn default_repetition_penalty() -> f64 {
    1.0
}
fn default_repetition_context_size() -> u32 {
    20
}

/// How the next token is chosen from the model's logits. Absent fields take the contract's
/// defaults ([`Sampling::default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sampling {
    /// Sampling temperature; 0 means greedy; default 0.7.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Nucleus sampling mass; 1.0 disables; default 0.9.
    #[serde(default = "default_top_p")]
    pub top_p: f64,
    /// Keep the k most likely tokens; 0 or -1 disables; default 40.
    #[serde(default = "default_top_k")]
    pub top_k: i32,
    /// Drop tokens below `min_p` times the top token's probability; default 0.
    #[serde(default)]
    pub min_p: f64,
    /// Penalty over the last `repetition_context_size` tokens; 1.0 (default) disables.
    #[serde(default = "default_repetition_penalty")]
    pub repetition_penalty: f64,
    /// Window of the repetition penalty (tokens); default 20.
    #[serde(default = "default_repetition_context_size")]
    pub repetition_context_size: u32,
    /// OpenAI presence penalty; default 0.
    #[serde(default)]
    pub presence_penalty: f64,
    /// OpenAI frequency penalty; default 0.
    #[serde(default)]
    pub frequency_penalty: f64,
    /// Same seed, params and model: same tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// OpenAI's `logit_bias`: token id (as a string) -> bias added to its logit (-100..=100).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub logit_bias: BTreeMap<String, f64>,
}

/// The contract's defaults: what a `generate` without sampler fields gets.
impl Default for Sampling {
    fn default() -> Self {
        with_defaults(json!({}))
    }
}

impl Sampling {
    /// Greedy decoding (temperature 0: the most likely token, so no filter applies) with
    /// nothing else changed: what parity runs and benchmarks ask for.
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        }
    }

    /// The biases of `logit_bias` by token id. Keys that are not token ids are refused by
    /// [`Sampling::check`]; this skips them.
    pub fn logit_biases(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        self.logit_bias
            .iter()
            .filter_map(|(id, bias)| Some((id.parse().ok()?, *bias)))
    }

    /// The one check of the sampler settings that produces a wire error; the engine's sampler
    /// only asserts what is checked here (it cannot name a field to the host).
    pub fn check(&self) -> Result<(), ResponseError> {
        let bad = |field: &str, reason: String| Err(ResponseError::invalid_params(field, reason));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                format!("must be >= 0, not {}", self.temperature),
            );
        }
        fits_f32("temperature", self.temperature, false)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("must be in (0, 1], not {}", self.top_p));
        }
        fits_f32("top_p", self.top_p, true)?;
        if self.top_k < -1 {
            return bad("top_k", format!("must be >= -1, not {}", self.top_k));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("must be in [0, 1], not {}", self.min_p));
        }
        if !(0.01..=100.0).contains(&self.repetition_penalty) {
            return bad(
                "repetition_penalty",
                format!("must be in 0.01..=100, not {}", self.repetition_penalty),
            );
        }
        // Past these, penalties push logits out of float range (their log-probabilities become
        // NaN): the fuzzer found such a generation.
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-100.0..=100.0).contains(&value) {
                return bad(field, format!("must be in -100..=100, not {value}"));
            }
        }
        for (id, bias) in &self.logit_bias {
            if id.parse::<u32>().is_err() {
                return bad("logit_bias", format!("keys are token ids, not {id:?}"));
            }
            if !(-100.0..=100.0).contains(bias) {
                return bad(
                    "logit_bias",
                    format!("biases are in -100..=100, not {bias}"),
                );
            }
        }
        Ok(())
    }
}

/// The engine's sampler computes in `f32`, as mlx-lm does: a setting that is in range as an
/// `f64` must stay so once narrowed (finite, and above 0 where `positive`).
fn fits_f32(field: &str, value: f64, positive: bool) -> Result<(), ResponseError> {
    let narrowed = value as f32;
    if narrowed.is_infinite() || (positive && narrowed <= 0.0) {
        return Err(ResponseError::invalid_params(
            field,
            format!("{value:e} is out of the range of f32, in which the sampler computes"),
        ));
    }
    Ok(())
}
