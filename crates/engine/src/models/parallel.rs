//! A model split over a group of ranks (`distributed.rs`), as mlx-lm splits one:
//!
//! - pipeline: each rank holds a contiguous run of layers (the first ranks one more when they
//!   do not divide); rank `r` receives the hidden state from `r - 1`, runs its layers, sends to
//!   `r + 1`; the last rank's output is gathered to every rank, which all compute the same
//!   logits (mlx-lm's `PipelineMixin` does the same, with the ranks in the other order).
//! - tensor: every rank holds all layers with `1/N` of each attention's heads and each MLP's
//!   columns: the query/key/value and gate/up projections split by output rows
//!   ("all-to-sharded"), the output and down projections by input columns ("sharded-to-all",
//!   summed over the group, then their bias added), as mlx-lm's `shard_linear` does. Embedding,
//!   norms and head stay whole.
//!
//! Every rank then samples the same token from the same logits, so all ranks run the same
//! steps and meet at the same collectives.

use std::{ops::Range, rc::Rc};

use mlx_rs::{ops::indexing::IndexOp, Array};

use crate::{
    distributed::Group,
    error::{EngineError, LoadErrorKind},
    nn::{Linear, Result},
    request::Parallel,
};

/// How this rank holds its part of a model split over `group`.
#[derive(Clone, Debug)]
pub struct Placement {
    pub group: Rc<Group>,
    pub mode: Parallel,
}

impl Placement {
    /// The layers of `n` this rank runs in a pipeline.
    pub fn stage(&self, n: usize) -> Range<usize> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let (base, extra) = (n / size, n % size);
        let start = rank * base + rank.min(extra);
        start..start + base + usize::from(rank < extra)
    }
}

/// Sums a sharded-to-all projection's partial outputs over the group, then adds its bias
/// (taken out of the layer when it was sharded: added once, after the sum).
#[derive(Debug)]
pub struct Reduce {
    group: Rc<Group>,
    bias: Option<Array>,
}

impl Reduce {
    pub fn apply(&self, partial: Array) -> Result<Array> {
        let sum = self.group.all_sum(&partial)?;
        match &self.bias {
            Some(b) => sum.add(b),
            None => Ok(sum),
        }
    }
}

pub fn refuse(what: impl Into<String>) -> EngineError {
    EngineError::InvalidParams {
        field: "parallel".into(),
        reason: what.into(),
    }
}

/// `n` equal parts of `x` along `axis`; `name` for the error when it does not divide.
pub fn part(
    x: &Array,
    axis: i32,
    group: &Group,
    name: &str,
) -> std::result::Result<Array, EngineError> {
    let n = group.size() as i32;
    if x.dim(axis) % n != 0 {
        return Err(refuse(format!(
            "`{name}` has {} {} that {n} ranks cannot share equally: use pipeline parallel or \
             another number of ranks",
            x.dim(axis),
            if axis == 0 { "rows" } else { "columns" }
        )));
    }
    let parts = x.split_equal(n, axis).map_err(|e| refuse(e.to_string()))?;
    // A copy of its own (as mlx's `shard_linear` makes): a view would keep the whole tensor.
    parts[group.rank()]
        .contiguous()
        .map_err(|e| refuse(e.to_string()))
}

/// Keeps this rank's output rows of `linear` (its heads or MLP columns).
pub fn shard_rows(
    linear: &mut Linear,
    group: &Group,
    name: &str,
) -> std::result::Result<(), EngineError> {
    refuse_adapter(linear, name)?;
    linear.weight = part(&linear.weight, 0, group, name)?;
    if let Some(b) = &linear.bias {
        linear.bias = Some(part(b, 0, group, name)?);
    }
    if let Some(q) = &mut linear.quantized {
        q.scales = part(&q.scales, 0, group, name)?;
        if let Some(b) = &q.biases {
            q.biases = Some(part(b, 0, group, name)?);
        }
    }
    Ok(())
}

/// Keeps this rank's input columns of `linear`; its output must then go through the returned
/// [`Reduce`]. A quantized weight splits by whole groups.
pub fn shard_columns(
    linear: &mut Linear,
    group: &Rc<Group>,
    name: &str,
) -> std::result::Result<Reduce, EngineError> {
    refuse_adapter(linear, name)?;
    linear.weight = part(&linear.weight, -1, group, name)?;
    if let Some(q) = &mut linear.quantized {
        q.scales = part(&q.scales, -1, group, name)?;
        if let Some(b) = &q.biases {
            q.biases = Some(part(b, -1, group, name)?);
        }
    }
    Ok(Reduce {
        group: group.clone(),
        bias: linear.bias.take(),
    })
}

fn refuse_adapter(linear: &Linear, name: &str) -> std::result::Result<(), EngineError> {
    match linear.lora {
        Some(_) => Err(refuse(format!(
            "`{name}` has an adapter; a split model takes none"
        ))),
        None => Ok(()),
    }
}

/// The pipeline's hand-over before a rank's layers: the previous rank's hidden state (shaped
/// like `h`), or `h` itself on the first rank.
pub fn receive(placement: &Placement, h: Array) -> Result<Array> {
    match placement.group.rank() {
        0 => Ok(h),
        r => placement.group.recv_like(&h, r - 1),
    }
}

/// The pipeline's hand-over after a rank's layers: sent on to the next rank, and the last
/// rank's output gathered to every rank.
pub fn hand_on(placement: &Placement, h: Array) -> Result<Array> {
    let group = &placement.group;
    let (rank, size) = (group.rank(), group.size());
    let h = match rank + 1 < size {
        true => {
            let sent = group.send(&h, rank + 1)?;
            // Scheduled now: a prefill evaluates only the caches, which do not depend on the
            // send, and the next rank waits for it (mlx-lm ties it to the last cache instead).
            mlx_rs::transforms::async_eval([&sent])?;
            sent
        }
        false => h,
    };
    let b = h.dim(0);
    let all = group.all_gather(&h)?;
    let last = (size as i32 - 1) * b;
    Ok(all.index(last..last + b))
}

/// Refuses a placement with no layer on some rank.
pub fn check_stage(placement: &Placement, layers: usize) -> std::result::Result<(), EngineError> {
    let size = placement.group.size();
    match layers >= size {
        true => Ok(()),
        false => Err(EngineError::load(
            LoadErrorKind::UnsupportedArchitecture,
            format!("{layers} layers cannot be split over {size} ranks: use fewer ranks"),
        )),
    }
}
