//! A model split over a group of ranks (`distributed.rs`), as mlx-lm splits one:
//!
//! - pipeline: each rank holds a contiguous run of layers (the first ranks one more when they
//!   do not divide); rank `r` receives the hidden state from `r - 1`, runs its layers, sends to
//!   `r + 1`; the last rank's output is gathered to every rank, which all compute the same
//!   logits (mlx-lm's `PipelineMixin` does the same, with the ranks in the other order).
//! - tensor: every rank holds all layers with `1/N` of each attention's heads and each MLP's
//!   columns: the query/key/value and gate/up projections split by output rows
//!   ("all-to-sharded"), the output and down projections by input columns ("sharded-to-all",
//!   summed over the group, then their bias added), as mlx-lm's `shard_linear` does. Embedding
//!   and norms stay whole; an untied head whose vocabulary the ranks divide is split by rows
//!   (`Decoder::split_vocabulary`), its logits gathered.
//!
//! Every rank then samples the same token from the same logits, so all ranks run the same
//! steps and meet at the same collectives.

use std::{cell::Cell, ops::Range, rc::Rc};

use mlx_rs::{ops::indexing::IndexOp, Array, Dtype};

use crate::{error::EngineError, layers::array::Result, layers::distributed::Group};

/// How a model is split over the ranks of a group (mlx-lm's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// Each rank holds a part of every layer's heads and MLP columns.
    Tensor,
    /// Each rank holds a run of whole layers.
    Pipeline,
}

/// How this rank holds its part of a model split over `group`.
#[derive(Clone, Debug)]
pub struct Placement {
    pub group: Rc<Group>,
    pub mode: Parallel,
    /// A pipeline's hidden-state dtypes, learnt in the first forward pass (the same in every
    /// pass): what this rank receives, and what the last rank gives out.
    pub dtypes: StageDtypes,
}

/// See [`Placement::dtypes`].
#[derive(Clone, Debug, Default)]
pub struct StageDtypes {
    incoming: Cell<Option<Dtype>>,
    outgoing: Cell<Option<Dtype>>,
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

/// Which part of a linear layer this rank holds under tensor parallel: `1/size` of its output
/// rows, or of its input columns (its outputs then summed over the group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Rows { rank: usize, size: usize },
    Columns { rank: usize, size: usize },
}

impl Split {
    /// `x`'s part along `axis` (`x` split like the layer: an adapter's matrix).
    pub fn part_of(self, x: &Array, axis: i32) -> mlx_rs::error::Result<Array> {
        let (Split::Rows { rank, size } | Split::Columns { rank, size }) = self;
        x.split_equal(size as i32, axis)?[rank].contiguous()
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
    /// The sum over `group` of a sharded layer's partial outputs, then `bias`.
    pub fn new(group: Rc<Group>, bias: Option<Array>) -> Self {
        Self { group, bias }
    }

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

/// The pipeline's hand-over before a rank's layers: the previous rank's hidden state (shaped
/// like `h`), or `h` itself on the first rank. In the first pass its dtype comes first: a
/// hidden state may change dtype on its way through the layers (float32 attention sinks under
/// bfloat16 weights make it float32), so only the sender knows it.
pub fn receive(placement: &Placement, h: Array) -> Result<Array> {
    let group = &placement.group;
    match group.rank() {
        0 => Ok(h),
        r => {
            let dtype = match placement.dtypes.incoming.get() {
                Some(dtype) => dtype,
                None => {
                    let code = group.recv_like(&Array::from_slice(&[0i32], &[1]), r - 1)?;
                    let dtype = dtype_of(&code)?;
                    placement.dtypes.incoming.set(Some(dtype));
                    dtype
                }
            };
            let like = h.as_dtype(dtype)?;
            let received = group.recv_like(&like, r - 1)?;
            // Scheduled now, so that it reads the socket before the collective `hand_on` runs
            // at once (the messages from the previous rank arrive in this order).
            mlx_rs::transforms::async_eval([&received])?;
            Ok(received)
        }
    }
}

/// The pipeline's hand-over after a rank's layers: sent on to the next rank, and the last
/// rank's output gathered to every rank. In the first pass the dtypes go first: the next rank's
/// input, and the last rank's output (every rank's part of the gather must have it).
pub fn hand_on(placement: &Placement, h: Array) -> Result<Array> {
    let group = &placement.group;
    let (rank, size) = (group.rank(), group.size());
    let code = |h: &Array| Array::from_slice(&[dtype_code(h.dtype())], &[1]);
    let first_pass = placement.dtypes.outgoing.get().is_none();
    let h = match rank + 1 < size {
        true => {
            // Scheduled now: a prefill evaluates only the caches, which do not depend on the
            // sends, and the next rank waits for them (mlx-lm ties its send to the last cache).
            if first_pass {
                let sent_code = group.send(&code(&h), rank + 1)?;
                mlx_rs::transforms::async_eval([&sent_code])?;
            }
            let sent = group.send(&h, rank + 1)?;
            mlx_rs::transforms::async_eval([&sent])?;
            sent
        }
        false => h,
    };
    let out_dtype = match placement.dtypes.outgoing.get() {
        Some(dtype) => dtype,
        None => {
            let last_code = match rank + 1 == size {
                true => code(&h),
                false => Array::from_slice(&[0i32], &[1]),
            };
            let dtype = dtype_of(&group.all_sum(&last_code)?)?;
            placement.dtypes.outgoing.set(Some(dtype));
            dtype
        }
    };
    let b = h.dim(0);
    let all = group.all_gather(&h.as_dtype(out_dtype)?)?;
    let last = (size as i32 - 1) * b;
    Ok(all.index(last..last + b))
}

/// A hidden state's dtype as sent between ranks.
fn dtype_code(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::Float16 => 1,
        Dtype::Bfloat16 => 2,
        _ => 0,
    }
}

fn dtype_of(code: &Array) -> Result<Dtype> {
    code.eval()?;
    Ok(match code.as_slice::<i32>()[0] {
        1 => Dtype::Float16,
        2 => Dtype::Bfloat16,
        _ => Dtype::Float32,
    })
}

/// Refuses a placement with no layer on some rank.
pub fn check_stage(placement: &Placement, layers: usize) -> std::result::Result<(), EngineError> {
    let size = placement.group.size();
    match layers >= size {
        true => Ok(()),
        false => Err(refuse(format!(
            "{layers} layers cannot be split over {size} ranks: use fewer ranks"
        ))),
    }
}
