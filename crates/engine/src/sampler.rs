//! Turning logits into the next token, in mlx-lm's order and with its semantics, on the device
//! (so the decode loop can queue step n+1 before step n's token is read):
//! logits processors (logit bias, repetition, presence, frequency penalties over the recent
//! tokens), log-softmax, then the filters top-p, min-p, top-k, then temperature sampling
//! (or argmax when the temperature is 0).

use mlx_rs::{ops, random, Array, Dtype};

use crate::{nn::Result, request::SamplerParams, EngineError};

/// The sampler of one generation: its settings and its random key.
pub struct Sampler {
    params: SamplerParams,
    key: Array,
    vocab: i32,
}

/// A scalar of `like`'s dtype, as Python's weakly typed scalars behave in MLX.
fn scalar_like(v: f32, like: &Array) -> Result<Array> {
    Array::from_f32(v).as_dtype(like.dtype())
}

fn neg_inf_like(like: &Array) -> Result<Array> {
    scalar_like(f32::NEG_INFINITY, like)
}

impl Sampler {
    /// Checks the settings against the vocabulary and seeds the random key.
    pub fn new(params: SamplerParams, vocab: usize) -> std::result::Result<Self, EngineError> {
        let bad = |field: &str, reason: String| {
            Err(EngineError::InvalidParams {
                field: field.into(),
                reason,
            })
        };
        let p = &params;
        if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
            return bad("temperature", "must be a finite number >= 0".into());
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]".into());
        }
        if !(0.0..=1.0).contains(&p.min_p) {
            return bad("min_p", "must be in [0, 1]".into());
        }
        if p.top_k >= vocab as i32 {
            return bad(
                "top_k",
                format!("must be below the vocabulary size {vocab} (0 disables)"),
            );
        }
        if !(p.repetition_penalty > 0.0 && p.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", "must be > 0 (1.0 disables)".into());
        }
        if let Some(&(id, _)) = p.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            return bad(
                "logit_bias",
                format!("token id {id} is outside the vocabulary ({vocab})"),
            );
        }
        let seed = p.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let key = random::key(seed).map_err(EngineError::from)?;
        Ok(Self {
            params,
            key,
            vocab: vocab as i32,
        })
    }

    /// Whether the logits processors need the token history.
    pub fn needs_history(&self) -> bool {
        let p = &self.params;
        !p.logit_bias.is_empty()
            || p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
    }

    /// How many recent tokens the penalties look at.
    pub fn history_window(&self) -> usize {
        self.params.repetition_context_size.max(1)
    }

    /// Applies logit bias and penalties to `(1, vocab)` logits; `recent` holds the last tokens
    /// (prompt included), at most `history_window()` of them.
    pub fn process(&self, logits: Array, recent: Option<&Array>) -> Result<Array> {
        let p = &self.params;
        let mut logits = logits;
        if !p.logit_bias.is_empty() {
            let ids: Vec<u32> = p.logit_bias.iter().map(|b| b.0).collect();
            let bias: Vec<f32> = p.logit_bias.iter().map(|b| b.1).collect();
            let mut dense = vec![0f32; self.vocab as usize];
            for (id, b) in ids.iter().zip(&bias) {
                dense[*id as usize] += b;
            }
            let dense = Array::from_slice(&dense, &[1, self.vocab]).as_dtype(logits.dtype())?;
            logits = logits.add(dense)?;
        }
        let Some(recent) = recent.filter(|r| r.size() > 0) else {
            return Ok(logits);
        };
        let idx = recent.reshape(&[1, -1])?;
        if p.repetition_penalty != 1.0 {
            let sel = logits.take_along_axis(&idx, -1)?;
            let penalty = scalar_like(p.repetition_penalty, &sel)?;
            let neg = sel.lt(scalar_like(0.0, &sel)?)?;
            let new = ops::select(&neg, sel.multiply(&penalty)?, sel.divide(&penalty)?)?;
            logits = logits.put_along_axis(&idx, &new, -1)?;
        }
        if p.presence_penalty != 0.0 {
            let sel = logits.take_along_axis(&idx, -1)?;
            let new = sel.subtract(scalar_like(p.presence_penalty, &sel)?)?;
            logits = logits.put_along_axis(&idx, &new, -1)?;
        }
        if p.frequency_penalty != 0.0 {
            // Each occurrence subtracts the penalty once (mlx-lm's `.at[].subtract`).
            let vocab = ops::arange::<_, i32>(0, self.vocab, 1)?.reshape(&[1, -1])?;
            let hits = recent
                .as_dtype(Dtype::Int32)?
                .reshape(&[-1, 1])?
                .eq(&vocab)?;
            let counts = hits.as_dtype(logits.dtype())?.sum_axis(0, true)?;
            logits =
                logits.subtract(counts.multiply(scalar_like(p.frequency_penalty, &logits)?)?)?;
        }
        Ok(logits)
    }

    /// Picks the next token from `(1, vocab)` log-probabilities; returns `(1,)` uint32.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        if p.temperature == 0.0 {
            return ops::indexing::argmax_axis(logprobs, -1, None);
        }
        let mut lp = logprobs.clone();
        if p.top_p > 0.0 && p.top_p < 1.0 {
            lp = top_p(&lp, p.top_p)?;
        }
        if p.min_p != 0.0 {
            lp = min_p(&lp, p.min_p)?;
        }
        if p.top_k > 0 {
            lp = top_k(&lp, p.top_k)?;
        }
        let (key, next) = random::split(&self.key, 2)?;
        self.key = next;
        let scaled = lp.multiply(scalar_like((1.0 / p.temperature as f64) as f32, &lp)?)?;
        random::categorical(&scaled, -1, None, &key)
    }
}

/// Log-softmax over the last axis: `x - logsumexp(x)`.
pub fn log_softmax(logits: &Array) -> Result<Array> {
    logits.subtract(logits.logsumexp_axis(-1, true)?)
}

/// Keeps the smallest set of tokens whose probability mass reaches `top_p`.
fn top_p(logprobs: &Array, top_p: f32) -> Result<Array> {
    let sorted = ops::sort_axis(logprobs, -1)?;
    let probs = ops::exp(sorted.as_dtype(Dtype::Float32)?)?;
    let mass_above = probs.cumsum(-1, true, false)?;
    let first = |a: &Array| a.take_axis(Array::from_slice(&[0i32], &[1]), -1);
    let total = first(&mass_above)?.add(first(&probs)?)?;
    let dropped = mass_above
        .ge(total.multiply(Array::from_f32(top_p))?)?
        .sum_axis(-1, true)?;
    let threshold = sorted.take_along_axis(&dropped, -1)?;
    ops::select(logprobs.lt(&threshold)?, neg_inf_like(logprobs)?, logprobs)
}

/// Drops tokens less likely than `min_p` times the most likely one.
fn min_p(logprobs: &Array, min_p: f32) -> Result<Array> {
    let top = logprobs.max_axis(-1, true)?;
    let cut = top.add(scalar_like((min_p as f64).ln() as f32, &top)?)?;
    ops::select(logprobs.lt(&cut)?, neg_inf_like(logprobs)?, logprobs)
}

/// Keeps the `k` most likely tokens.
fn top_k(logprobs: &Array, k: i32) -> Result<Array> {
    let order = ops::argpartition_axis(&logprobs.negative()?, k - 1, -1)?;
    let vocab = logprobs.dim(-1);
    let drop = order.take_axis(ops::arange::<_, i32>(k, vocab, 1)?, -1)?;
    let inf = ops::broadcast_to(neg_inf_like(logprobs)?, drop.shape())?;
    logprobs.put_along_axis(&drop, &inf, -1)
}
