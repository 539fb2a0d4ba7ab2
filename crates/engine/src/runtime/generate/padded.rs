//! A batch's decode step over one padded cache ([`PaddedCache`]): which sequences' caches it
//! holds, moving them in and out, and the step's logits. Between steps a sequence's caches
//! are either its own (`SequenceState::caches`) or a row of the padded cache (its own then empty),
//! never both: rows go back to their sequences before anything else reads their caches (a
//! step of one, a step where they do not run, their end).

use mlx_rs::{ops, Array};

use super::{context::Result, sequence::Sequence};
use crate::{layers::kv_cache::Caches, layers::kv_cache::PaddedCache, models::Input, EngineError};

/// Makes `cache` hold exactly the rows of `members` (indices into `seqs`) when they can step
/// together over it (two or more, a model that runs padded, every cache a full-attention
/// one); else it holds none. Rows leaving go back to their sequences. Whether to step padded.
pub(super) fn prepare(
    seqs: &mut [Sequence<'_>],
    members: &[usize],
    cache: &mut PaddedCache,
) -> Result<bool> {
    let held = |s: &Sequence<'_>| cache.ids().contains(&s.id);
    let padded = members.len() > 1
        && seqs[members[0]].dec.ctx.model.facts().batching.padded
        && (members.iter()).all(|&i| held(&seqs[i]) || PaddedCache::fits(&seqs[i].dec.caches));
    let wanted: Vec<usize> = match padded {
        true => members.iter().map(|&i| seqs[i].id).collect(),
        false => Vec::new(),
    };
    let back = |id: usize, caches| {
        if let Some(s) = seqs.iter_mut().find(|s| s.id == id) {
            s.dec.caches = caches;
        }
    };
    cache.retain(|id| wanted.contains(&id), back)?;
    for &i in members.iter().filter(|_| padded) {
        let s = &mut seqs[i];
        if !cache.ids().contains(&s.id) {
            cache.join(s.id, &s.dec.caches)?;
            s.dec.caches = Vec::new();
        }
    }
    Ok(padded)
}

/// The next logits `(1, V)` of each of `members` (as [`prepare`] left `cache`), in the order
/// of `members`, from one forward pass over the padded cache.
pub(super) fn logits(
    seqs: &mut [Sequence<'_>],
    members: &[usize],
    cache: &mut PaddedCache,
) -> Result<Vec<Array>> {
    let model = seqs[members[0]].dec.ctx.model;
    // Row order is the cache's.
    let rows: Vec<usize> = (cache.ids().iter())
        .map(|id| members.iter().copied().find(|&i| seqs[i].id == *id))
        .collect::<Option<_>>()
        .ok_or_else(|| EngineError::Generation("a padded batch row has no sequence".into()))?;
    let tokens: Vec<Array> = rows.iter().map(|&i| seqs[i].step.token.clone()).collect();
    let ids = ops::concatenate(&tokens, 0)?;
    let ids = ids.reshape(&[-1, 1])?;
    let logits = model.forward(Input::tokens(&ids), Caches::Padded(cache))?;
    let mut by_row = Vec::with_capacity(rows.len());
    for (b, (&i, token)) in rows.iter().zip(&tokens).enumerate() {
        by_row.push((i, seqs[i].dec.row_logits(&logits, b, token)?));
    }
    Ok((members.iter())
        .map(|i| {
            by_row
                .iter()
                .find(|(j, _)| j == i)
                .expect("every member is a row")
                .1
                .clone()
        })
        .collect())
}

/// Gives sequence `s` its caches back if `cache` holds them.
pub(super) fn release(s: &mut Sequence<'_>, cache: &mut PaddedCache) -> Result<()> {
    let id = s.id;
    cache.retain(|row| row != id, |_, caches| s.dec.caches = caches)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops::indexing::IndexOp, Array};

    use crate::{
        layers::device::on_gpu,
        layers::kv_cache::{Caches, PaddedCache},
        models::Input,
        Engine,
    };

    /// Decode steps over a padded cache give each row the logits row-by-row attention gives it
    /// in the same batch (whose rows are a lone run's wherever BLAS gives a row the same bits
    /// in a product of that many rows: docs/traps.md): on the CPU bit for bit, for rows far
    /// apart in length (short rows inside OpenBLAS's first inner-axis block of the longest
    /// row's sum, long ones past it, where a weighted sum over the padded length would group
    /// their terms otherwise), before and after the longest row leaves; on a GPU to rounding.
    #[test]
    fn padded_steps_give_each_row_its_row_by_row_logits() {
        let _mlx = fixtures::mlx_test_lock();
        let (mut engine, dir) = Engine::with_tiny_llama("padded");
        let model = engine.models[0].split().0.model;
        let batching = model.facts().batching;
        assert!(batching.padded && batching.rows);
        let ids = |c: &[u32]| Array::from_slice(c, &[1, c.len() as i32]);
        let prompts: Vec<Vec<u32>> = [9, 1100, 300, 520]
            .iter()
            .map(|&n| (0..n).map(|i| 3 + (i * 7 + n) % 200).collect())
            .collect();
        let (mut own, mut padded) = (Vec::new(), PaddedCache::default());
        for (id, p) in prompts.iter().enumerate() {
            let mut caches = model.make_caches();
            let tokens = ids(p);
            (model.forward(Input::tokens(&tokens), Caches::One(&mut caches))).unwrap();
            padded.join(id, &caches).unwrap();
            own.push(caches);
        }
        for step in 0..6u32 {
            if step == 3 {
                // The longest row leaves; the others go on over a shorter capacity.
                padded.retain(|id| id != 1, |_, _| {}).unwrap();
            }
            let rows: Vec<usize> = padded.ids().to_vec();
            let tokens: Vec<u32> = rows.iter().map(|&r| 10 + step + r as u32).collect();
            let batch = Array::from_slice(&tokens, &[rows.len() as i32, 1]);
            let input = Input::tokens(&batch);
            let logits = model.forward(input, Caches::Padded(&mut padded)).unwrap();
            let mut caches: Vec<&mut [_]> = (own.iter_mut().enumerate())
                .filter(|(r, _)| rows.contains(r))
                .map(|(_, c)| c.as_mut_slice())
                .collect();
            let input = Input::tokens(&batch);
            let by_rows = model.forward(input, Caches::Rows(&mut caches)).unwrap();
            let same = match on_gpu() {
                false => by_rows.eq_values(&logits).unwrap(),
                true => by_rows.all_close(&logits, 1e-3, 1e-3, None).unwrap(),
            };
            for (b, r) in rows.iter().enumerate().filter(|_| !same) {
                let b = b as i32;
                let (x, y) = (by_rows.index(b..b + 1), logits.index(b..b + 1));
                assert!(x.eq_values(&y).unwrap(), "step {step}, sequence {r}");
            }
            assert!(same, "step {step}: the padded rows' logits");
        }
        drop(engine);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
