//! Speculative sampling's acceptance rule, for drafts drawn at random (a draft model or a
//! multi-token-prediction head when the request samples): a draft token `x` drawn from the
//! drafter's distribution `q` is kept with probability `min(1, p(x) / q(x))`, `p` the model's
//! distribution there (its filters and temperature); at the first one refused, the token is
//! drawn from the residual `max(0, p - q)`, renormalised. Every token is then distributed as `p`,
//! as without drafts (Leviathan et al. 2023, Chen et al. 2023), and more drafts are kept than by
//! comparing each with a token drawn from `p` (which keeps `x` with probability `p(x)` only).

use mlx_rs::{ops, transforms, Array};

use super::{context::Result, state::Step};
use crate::runtime::sampler::Sampler;

/// How many of `draft` (token `i` drawn from the log-probabilities `q[i]` `(1, V)`) are kept,
/// given the model's `steps` at each position (their log-probabilities as the sampler takes
/// them, before its filters and temperature). The kept drafts become those steps' tokens; at
/// the first one refused, its step's token is replaced by one drawn from the residual.
pub(super) fn judge(
    sampler: &mut Sampler,
    steps: &mut [Step],
    draft: &[u32],
    q: &[Array],
) -> Result<usize> {
    let k = draft.len();
    let mut p = Vec::with_capacity(k);
    let mut keep = Vec::with_capacity(k);
    if k > 0 {
        let u = sampler.uniform(k as i32)?;
        for (i, (&x, q)) in draft.iter().zip(q).enumerate() {
            let pi = sampler.distribution(&steps[i].logprobs)?;
            let x = Array::from_slice(&[x as i32], &[1, 1]);
            let log_ratio = pi
                .take_along_axis(&x, -1)?
                .subtract(q.take_along_axis(&x, -1)?)?;
            let ui = u.take_axis(Array::from_slice(&[i as i32], &[1]), 0)?;
            keep.push(ui.lt(ops::exp(&log_ratio.reshape(&[1])?)?)?);
            p.push(pi);
        }
        transforms::eval(&keep)?;
    }
    let accepted = keep.iter().take_while(|k| k.item_exact::<bool>()).count();
    // A kept draft is the token there (the model's own draw was only for comparing).
    for (step, &x) in steps.iter_mut().zip(draft).take(accepted) {
        step.token = Array::from_slice(&[x], &[1]);
    }
    if accepted < k {
        steps[accepted].token = residual(sampler, &p[accepted], &q[accepted])?;
    } else if let Some(q) = q.get(k) {
        // A draft the constraint refused: rejected whatever the odds (its probability is 0).
        let p = sampler.distribution(&steps[k].logprobs)?;
        steps[k].token = residual(sampler, &p, q)?;
    }
    Ok(accepted)
}

/// A token drawn from `max(0, p - q)` renormalised (log-probabilities in, `(1,)` out).
fn residual(sampler: &mut Sampler, p: &Array, q: &Array) -> Result<Array> {
    let residual = ops::maximum(ops::exp(p)?.subtract(ops::exp(q)?)?, Array::from_f32(0.0))?;
    let total = residual.sum(None)?;
    total.eval()?;
    // p == q (to rounding) leaves nothing: then refusing was as likely as nothing, draw p.
    let weights = match total.item_exact::<f32>() > 0.0 {
        true => ops::log(&residual)?,
        false => p.clone(),
    };
    Ok(sampler.draw(&weights)?)
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;
    use protocol::methods::Sampling;

    use super::{judge, Step};
    use crate::runtime::sampler::{log_softmax, Sampler};

    /// Tokens that come out of `judge` over `n` drafts drawn from `q`, the model's
    /// distribution `p` (a zero where a constraint refuses the token: such a draft is cut before
    /// judging, as `guided.rs` cuts it), and how many drafts were kept.
    fn outcomes(p: &[f32], q: &[f32], n: usize) -> ([usize; 5], usize) {
        let sampling = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: Some(11),
            ..Sampling::default()
        };
        let mut sampler = Sampler::new(sampling, p.len()).unwrap();
        let row = |v: &[f32]| log_softmax(&Array::from_slice(v, &[1, 5]).log().unwrap()).unwrap();
        let (lp, lq) = (row(p), row(q));
        let (mut counts, mut kept) = ([0usize; 5], 0usize);
        for _ in 0..n {
            let x = sampler.draw(&lq).unwrap().item_exact::<u32>();
            let mut steps = [Step {
                token: Array::from_slice(&[u32::MAX], &[1]),
                logprobs: lp.clone(),
            }];
            let draft = match p[x as usize] > 0.0 {
                true => vec![x],
                false => vec![],
            };
            let accepted =
                judge(&mut sampler, &mut steps, &draft, std::slice::from_ref(&lq)).unwrap();
            let token = steps[0].token.item_exact::<u32>();
            if accepted == 1 {
                assert_eq!(token, x, "a kept draft is the token there");
            }
            kept += accepted;
            counts[token as usize] += 1;
        }
        (counts, kept)
    }

    /// Chi-square statistic of `counts` against `p` (4 degrees of freedom, or fewer where `p`
    /// is 0: those must not occur at all).
    fn chi_square(counts: &[usize; 5], p: &[f32]) -> f64 {
        let n: usize = counts.iter().sum();
        (counts.iter().zip(p))
            .map(|(&o, &p)| match p > 0.0 {
                true => (o as f64 - n as f64 * p as f64).powi(2) / (n as f64 * p as f64),
                false => {
                    assert_eq!(o, 0, "a token of probability 0 came out");
                    0.0
                }
            })
            .sum()
    }

    /// Over a vocabulary of five, drafts drawn from `q` and judged against `p`: the tokens that
    /// come out follow `p` (chi-square, far below the 0.1% critical value 18.47 of 4 degrees
    /// of freedom), and drafts are kept as often as `sum(min(p, q))`.
    #[test]
    fn tokens_follow_the_models_distribution_whatever_the_drafts() {
        let _mlx = fixtures::mlx_test_lock();
        let p = [0.5f32, 0.2, 0.15, 0.1, 0.05];
        let q = [0.1f32, 0.3, 0.3, 0.05, 0.25];
        let n = 6000;
        let (counts, kept) = outcomes(&p, &q, n);
        let chi2 = chi_square(&counts, &p);
        assert!(chi2 < 18.47, "chi-square {chi2:.2}: {counts:?}");
        let expected: f64 = p.iter().zip(q).map(|(a, b)| a.min(b) as f64).sum();
        let rate = kept as f64 / n as f64;
        let sigma = (expected * (1.0 - expected) / n as f64).sqrt();
        assert!(
            (rate - expected).abs() < 4.0 * sigma,
            "kept {rate:.3}, expected {expected:.3}"
        );
    }

    /// A draft the constraint refuses is cut, and the token there is drawn as for a rejected
    /// draft: the output still follows the constrained `p` (a draft model does not know the
    /// constraint, so its `q` puts mass on the refused token).
    #[test]
    fn a_draft_the_constraint_refuses_leaves_the_distribution_as_it_is() {
        let _mlx = fixtures::mlx_test_lock();
        let p = [0.4f32, 0.3, 0.2, 0.1, 0.0];
        let q = [0.1f32, 0.3, 0.2, 0.05, 0.35];
        let (counts, _) = outcomes(&p, &q, 6000);
        // Three degrees of freedom: the 0.1% critical value is 16.27.
        let chi2 = chi_square(&counts, &p);
        assert!(chi2 < 16.27, "chi-square {chi2:.2}: {counts:?}");
    }
}
