//! Turning logits into the next token, in mlx-lm's order and with its semantics, on the device
//! (so the decode loop can queue step n+1 before step n's token is read):
//! logits processors (logit bias, repetition, presence, frequency penalties over the recent
//! tokens), log-softmax, then the filters top-p, min-p, top-k, then temperature sampling
//! (or argmax when the temperature is 0).

use mlx_rs::{ops, random, Array, Dtype};

use protocol::methods::Sampling;

use crate::{layers::Result, EngineError};

/// The sampler of one generation: its settings (the contract's, as the request gave them; they
/// are narrowed to `f32` where used, as mlx-lm computes) and its random key.
pub struct Sampler {
    params: Sampling,
    key: Array,
    /// `logit_bias` as a dense `(1, vocab)` row, built once.
    bias: Option<Array>,
    /// `0..vocab` as a `(1, vocab)` row, for counting occurrences (frequency penalty).
    vocab_ids: Option<Array>,
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
    ///
    /// # Panics
    /// If a setting is outside the range [`Sampling::check`] allows. Ranges are the caller's
    /// to check: the worker checks them in the protocol layer (`Generate::validate`), the one
    /// place that answers a bad one with `-32602` and its field, so these asserts cannot be
    /// reached from the wire. Only the vocabulary, which only the engine knows, is checked here.
    pub fn new(params: Sampling, vocab: usize) -> std::result::Result<Self, EngineError> {
        let p = &params;
        assert!(
            p.temperature >= 0.0 && p.temperature.is_finite(),
            "temperature {} is not a finite number >= 0",
            p.temperature
        );
        assert!(
            p.top_p > 0.0 && p.top_p <= 1.0,
            "top_p {} is not in (0, 1]",
            p.top_p
        );
        assert!(
            (0.0..=1.0).contains(&p.min_p),
            "min_p {} is not in [0, 1]",
            p.min_p
        );
        assert!(
            p.repetition_penalty > 0.0 && p.repetition_penalty.is_finite(),
            "repetition_penalty {} is not a finite number > 0",
            p.repetition_penalty
        );
        if let Some((id, _)) = p.logit_biases().find(|(id, _)| *id as usize >= vocab) {
            return Err(EngineError::InvalidParams {
                field: "logit_bias".into(),
                reason: format!("token id {id} is outside the vocabulary ({vocab})"),
            });
        }
        let seed = p.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let key = random::key(seed).map_err(EngineError::from)?;
        let bias = (!params.logit_bias.is_empty()).then(|| {
            let mut dense = vec![0f32; vocab];
            for (id, b) in params.logit_biases() {
                dense[id as usize] += b as f32;
            }
            Array::from_slice(&dense, &[1, vocab as i32])
        });
        let vocab_ids = (params.frequency_penalty != 0.0)
            .then(|| ops::arange::<_, i32>(0, vocab as i32, 1)?.reshape(&[1, -1]))
            .transpose()?;
        Ok(Self {
            params,
            key,
            bias,
            vocab_ids,
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
        (self.params.repetition_context_size as usize).max(1)
    }

    /// Applies logit bias and penalties to `(1, vocab)` logits; `recent` holds the last tokens
    /// (prompt included), at most `history_window()` of them.
    pub fn process(&self, logits: Array, recent: Option<&Array>) -> Result<Array> {
        let p = &self.params;
        let mut logits = logits;
        if let Some(bias) = &self.bias {
            logits = logits.add(bias.as_dtype(logits.dtype())?)?;
        }
        let Some(recent) = recent.filter(|r| r.size() > 0) else {
            return Ok(logits);
        };
        let idx = recent.reshape(&[1, -1])?;
        if p.repetition_penalty != 1.0 {
            let sel = logits.take_along_axis(&idx, -1)?;
            let penalty = scalar_like(p.repetition_penalty as f32, &sel)?;
            let neg = sel.lt(scalar_like(0.0, &sel)?)?;
            let new = ops::select(&neg, sel.multiply(&penalty)?, sel.divide(&penalty)?)?;
            logits = logits.put_along_axis(&idx, &new, -1)?;
        }
        if p.presence_penalty != 0.0 {
            let sel = logits.take_along_axis(&idx, -1)?;
            let new = sel.subtract(scalar_like(p.presence_penalty as f32, &sel)?)?;
            logits = logits.put_along_axis(&idx, &new, -1)?;
        }
        if let Some(vocab_ids) = &self.vocab_ids {
            // Each occurrence subtracts the penalty once (mlx-lm's `.at[].subtract`).
            let hits = recent
                .as_dtype(Dtype::Int32)?
                .reshape(&[-1, 1])?
                .eq(vocab_ids)?;
            let counts = hits.as_dtype(logits.dtype())?.sum_axis(0, true)?;
            let penalty = scalar_like(p.frequency_penalty as f32, &logits)?;
            logits = logits.subtract(counts.multiply(penalty)?)?;
        }
        Ok(logits)
    }

    /// Picks the next token from `(1, vocab)` log-probabilities; returns `(1,)` uint32.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        if !self.is_random() {
            return ops::indexing::argmax_axis(logprobs, -1, None);
        }
        let scaled = self.scaled(logprobs)?;
        self.draw(&scaled)
    }

    /// Whether tokens are drawn at random (temperature > 0), not the most likely one.
    pub fn is_random(&self) -> bool {
        self.params.temperature != 0.0
    }

    /// The log-probabilities `(1, vocab)` that [`Self::sample`] draws from, given the
    /// log-probabilities it is given (temperature > 0): filtered, scaled, normalised.
    pub fn distribution(&self, logprobs: &Array) -> Result<Array> {
        log_softmax(&self.scaled(logprobs)?)
    }

    /// A token `(1,)` drawn from log-weights `(1, vocab)` (normalised or not), with the next
    /// random key.
    pub fn draw(&mut self, weights: &Array) -> Result<Array> {
        let (key, next) = random::split(&self.key, 2)?;
        self.key = next;
        random::categorical(weights, -1, None, &key)
    }

    /// `n` draws in `[0, 1)`, with the next random key.
    pub fn uniform(&mut self, n: i32) -> Result<Array> {
        let (key, next) = random::split(&self.key, 2)?;
        self.key = next;
        random::uniform::<_, f32>(0.0, 1.0, &[n], &key)
    }

    /// The filters (top-p, min-p, top-k), then the temperature.
    fn scaled(&self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        let temperature = p.temperature as f32;
        let mut lp = logprobs.clone();
        let top_p_mass = p.top_p as f32;
        if top_p_mass > 0.0 && top_p_mass < 1.0 {
            lp = top_p(&lp, top_p_mass)?;
        }
        let min_p_ratio = p.min_p as f32;
        if min_p_ratio != 0.0 {
            lp = min_p(&lp, min_p_ratio)?;
        }
        // A top_k at or above the vocabulary keeps every token (mlx-lm would raise instead).
        if p.top_k > 0 && p.top_k < lp.dim(-1) {
            lp = top_k(&lp, p.top_k)?;
        }
        lp.multiply(scalar_like((1.0 / temperature as f64) as f32, &lp)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(values: &[f32]) -> Array {
        Array::from_slice(values, &[1, values.len() as i32])
    }

    fn logprobs_of(probs: &[f32]) -> Array {
        let ln: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        log_softmax(&logits(&ln)).unwrap()
    }

    fn sampler(params: Sampling, vocab: usize) -> Sampler {
        Sampler::new(params, vocab).unwrap()
    }

    fn greedy() -> Sampling {
        Sampling::greedy()
    }

    fn only_temp(seed: u64) -> Sampling {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: Some(seed),
            ..Sampling::default()
        }
    }

    /// Frequencies of each token over `n` draws.
    fn histogram(s: &mut Sampler, lp: &Array, n: usize) -> Vec<usize> {
        let mut counts = vec![0; lp.dim(-1) as usize];
        for _ in 0..n {
            counts[s.sample(lp).unwrap().item_exact::<u32>() as usize] += 1;
        }
        counts
    }

    #[test]
    fn temperature_zero_is_argmax() {
        let _mlx = fixtures::mlx_test_lock();
        let mut s = sampler(greedy(), 4);
        let lp = logprobs_of(&[0.1, 0.2, 0.6, 0.1]);
        assert_eq!(s.sample(&lp).unwrap().item_exact::<u32>(), 2);
    }

    #[test]
    fn temperature_one_follows_the_distribution() {
        let _mlx = fixtures::mlx_test_lock();
        let mut s = sampler(only_temp(11), 3);
        let counts = histogram(&mut s, &logprobs_of(&[0.7, 0.2, 0.1]), 3000);
        let freq: Vec<f64> = counts.iter().map(|&c| c as f64 / 3000.0).collect();
        for (f, p) in freq.iter().zip([0.7, 0.2, 0.1]) {
            assert!((f - p).abs() < 0.04, "frequencies {freq:?}");
        }
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let _mlx = fixtures::mlx_test_lock();
        let lp = logprobs_of(&[0.25, 0.25, 0.25, 0.25]);
        let draw = |seed| histogram_seq(&mut sampler(only_temp(seed), 4), &lp, 64);
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    fn histogram_seq(s: &mut Sampler, lp: &Array, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| s.sample(lp).unwrap().item_exact::<u32>())
            .collect()
    }

    #[test]
    fn top_k_at_or_above_the_vocabulary_keeps_everything() {
        let _mlx = fixtures::mlx_test_lock();
        let params = Sampling {
            top_k: 40,
            ..only_temp(9)
        };
        let counts = histogram(&mut sampler(params, 3), &logprobs_of(&[0.4, 0.3, 0.3]), 300);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    }

    #[test]
    fn top_k_keeps_the_k_most_likely() {
        let _mlx = fixtures::mlx_test_lock();
        let params = Sampling {
            top_k: 2,
            ..only_temp(1)
        };
        let counts = histogram(
            &mut sampler(params, 5),
            &logprobs_of(&[0.1, 0.3, 0.05, 0.35, 0.2]),
            400,
        );
        assert_eq!(counts[0] + counts[2] + counts[4], 0, "{counts:?}");
        assert!(counts[1] > 0 && counts[3] > 0, "{counts:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        let _mlx = fixtures::mlx_test_lock();
        let lp = logprobs_of(&[0.6, 0.3, 0.1]);
        let counts = histogram(
            &mut sampler(
                Sampling {
                    top_p: 0.5,
                    ..only_temp(2)
                },
                3,
            ),
            &lp,
            200,
        );
        assert_eq!(counts, vec![200, 0, 0]);
        let counts = histogram(
            &mut sampler(
                Sampling {
                    top_p: 0.8,
                    ..only_temp(3)
                },
                3,
            ),
            &lp,
            400,
        );
        assert!(
            counts[0] > 0 && counts[1] > 0 && counts[2] == 0,
            "{counts:?}"
        );
    }

    #[test]
    fn min_p_drops_tokens_below_a_fraction_of_the_top() {
        let _mlx = fixtures::mlx_test_lock();
        let lp = logprobs_of(&[0.5, 0.3, 0.2]);
        let counts = histogram(
            &mut sampler(
                Sampling {
                    min_p: 0.5,
                    ..only_temp(4)
                },
                3,
            ),
            &lp,
            400,
        );
        assert!(
            counts[0] > 0 && counts[1] > 0 && counts[2] == 0,
            "{counts:?}"
        );
        // min_p = 1 keeps only the top token (at least one token always survives).
        let counts = histogram(
            &mut sampler(
                Sampling {
                    min_p: 1.0,
                    ..only_temp(4)
                },
                3,
            ),
            &lp,
            50,
        );
        assert_eq!(counts, vec![50, 0, 0]);
    }

    #[test]
    fn penalties_and_bias_follow_mlx_lm_semantics() {
        let _mlx = fixtures::mlx_test_lock();
        let history = Array::from_slice(&[1u32, 2, 2], &[3]);
        let base = logits(&[1.0, 2.0, -2.0, 4.0]);
        let run = |p: Sampling| -> Vec<f32> {
            let s = sampler(
                Sampling {
                    temperature: 0.0,
                    ..p
                },
                4,
            );
            s.process(base.clone(), Some(&history))
                .unwrap()
                .as_slice::<f32>()
                .to_vec()
        };
        // Repetition: positive logits divided, negative multiplied, each seen token once.
        assert_eq!(
            run(Sampling {
                repetition_penalty: 2.0,
                ..greedy()
            }),
            vec![1.0, 1.0, -4.0, 4.0]
        );
        // Presence: subtract once per seen token; frequency: once per occurrence.
        assert_eq!(
            run(Sampling {
                presence_penalty: 0.5,
                ..greedy()
            }),
            vec![1.0, 1.5, -2.5, 4.0]
        );
        assert_eq!(
            run(Sampling {
                frequency_penalty: 0.5,
                ..greedy()
            }),
            vec![1.0, 1.5, -3.0, 4.0]
        );
        assert_eq!(
            run(Sampling {
                logit_bias: [("0".to_owned(), 10.0)].into(),
                ..greedy()
            }),
            vec![11.0, 2.0, -2.0, 4.0]
        );
    }

    #[test]
    fn a_token_id_outside_the_vocabulary_is_refused_with_the_field() {
        let _mlx = fixtures::mlx_test_lock();
        let params = Sampling {
            logit_bias: [("99".to_owned(), 1.0)].into(),
            ..greedy()
        };
        match Sampler::new(params, 10) {
            Err(EngineError::InvalidParams { field, .. }) => assert_eq!(field, "logit_bias"),
            other => panic!("expected InvalidParams, got {:?}", other.err()),
        }
    }

    /// What `Sampler::new` panics with for greedy settings changed by `change`.
    fn panic_message(change: impl FnOnce(&mut Sampling)) -> String {
        let mut params = greedy();
        change(&mut params);
        // The asserts come before any MLX call.
        let panic = std::panic::catch_unwind(|| Sampler::new(params, 10).map(|_| ()))
            .expect_err("out-of-range settings should panic");
        *panic.downcast::<String>().expect("a formatted message")
    }

    #[test]
    fn out_of_range_settings_are_bugs_of_the_caller() {
        assert!(panic_message(|p| p.top_p = 1.5).starts_with("top_p"));
        assert!(panic_message(|p| p.top_p = 0.0).starts_with("top_p"));
        assert!(panic_message(|p| p.temperature = -1.0).starts_with("temperature"));
        assert!(panic_message(|p| p.temperature = f64::INFINITY).starts_with("temperature"));
        assert!(panic_message(|p| p.min_p = 2.0).starts_with("min_p"));
        assert!(panic_message(|p| p.repetition_penalty = 0.0).starts_with("repetition_penalty"));
    }
}
