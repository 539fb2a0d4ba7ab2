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
        && seqs[members[0]].dec.ctx.batching.padded
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
