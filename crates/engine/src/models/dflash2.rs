//! DFlash2's pieces beside the DFlash block drafter (mlx-vlm's `dflash2` drafter): a causal
//! convolution over the block around each layer's attention and MLP, whose kernel is a stored
//! base plus a part computed from the block itself, and a candidate selector that picks each
//! guess among the head's best few, scored with the guess before it.

use mlx_rs::{ops, ops::indexing::IndexOp, Array};

use crate::{
    error::EngineError,
    layers::weights::Weights,
    layers::{Embedding, Linear, Result},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

/// A grouped causal convolution over the block's positions (`GroupedDynamicCausalConv`): the
/// kernel of offset `o` for group `g` is `base[o, g] + dynamic[o, g]`, the dynamic part
/// projected from the (normed) block. Each layer prepares its input with the first kernel and
/// finishes the sublayer's output with the second.
pub struct GroupedConv {
    /// `(2, kernel, hidden)`: the prepare and finish kernels.
    base_kernel: Array,
    kernel_projection: Linear,
    kernel: i32,
    group: i32,
}

impl GroupedConv {
    pub fn load(weights: &mut Weights, p: &str, kernel: i32, group: i32) -> LoadResult<Self> {
        Ok(Self {
            base_kernel: weights.take(&format!("{p}.base_kernel"))?,
            kernel_projection: weights.linear(&format!("{p}.kernel_projection"))?,
            kernel,
            group,
        })
    }

    /// `x` `(B, L, H)` convolved with the first kernel, and the dynamic part of the second.
    pub fn prepare(&self, x: &Array) -> Result<(Array, Array)> {
        let (b, l, h) = (x.dim(0), x.dim(1), x.dim(2));
        let dynamic = (self.kernel_projection.forward(x)?).reshape(&[
            b,
            l,
            2,
            self.kernel,
            h / self.group,
        ])?;
        let first = dynamic.index((.., .., 0, .., ..));
        let second = dynamic.index((.., .., 1, .., ..));
        Ok((self.convolve(x, &first, 0)?, second))
    }

    /// A sublayer's output `x` convolved with the second kernel (`dynamic` from [`prepare`]).
    pub fn finish(&self, x: &Array, dynamic: &Array) -> Result<Array> {
        self.convolve(x, dynamic, 1)
    }

    /// `sum_o (base[which, o] + dynamic[o]) * x shifted o positions later`, in mlx-vlm's order.
    fn convolve(&self, x: &Array, dynamic: &Array, which: i32) -> Result<Array> {
        let (b, l, h) = (x.dim(0), x.dim(1), x.dim(2));
        let groups = h / self.group;
        let blocks = x.reshape(&[b, l, groups, self.group])?;
        let dynamic = dynamic.reshape(&[b, l, self.kernel, groups, 1])?;
        let base = self.base_kernel.index(which);
        let mut out = ops::zeros_like(&blocks)?;
        for offset in 0..self.kernel {
            let values = match offset {
                0 => blocks.clone(),
                o if o >= l => ops::zeros_like(&blocks)?,
                o => ops::concatenate(
                    &[
                        ops::zeros_like(blocks.index((.., ..o)))?,
                        blocks.index((.., ..l - o)),
                    ],
                    1,
                )?,
            };
            let kernel = (base.index(offset))
                .reshape(&[1, 1, groups, self.group])?
                .as_dtype(x.dtype())?;
            let weight = kernel.add(dynamic.index((.., .., offset)))?;
            out = out.add(weight.multiply(&values)?)?;
        }
        out.reshape(&[b, l, h])
    }
}

/// DFlash2's candidate selector (`CandidateSelector`): each guess is one of the head's
/// `top_k` best tokens at its position, scored by its logit plus a low-rank edge between the
/// guess before it (the predecessor), the position's hidden state and the candidate.
pub struct CandidateSelector {
    predecessor: Embedding,
    successor: Embedding,
    hidden_projection: Linear,
    pub top_k: i32,
}

/// The selector's view of one block: per position, the candidates and their logits, and the
/// projected hidden states.
pub struct Candidates {
    /// `(P, k)` token ids and `(P, k)` their logits.
    pub tokens: Array,
    unary: Array,
    /// `(P, rank)`.
    hidden: Array,
}

impl CandidateSelector {
    pub fn load(weights: &mut Weights, top_k: i32) -> LoadResult<Self> {
        // Releases store the codebooks as bare tables or as embeddings (`.weight`).
        for name in ["predecessor_codebook", "successor_codebook"] {
            let bare = format!("candidate_selector.{name}");
            if let Some(table) = weights.remove(&bare) {
                weights.insert(format!("{bare}.weight"), table);
            }
        }
        Ok(Self {
            predecessor: weights.embedding("candidate_selector.predecessor_codebook")?,
            successor: weights.embedding("candidate_selector.successor_codebook")?,
            hidden_projection: weights.linear("candidate_selector.hidden_projection")?,
            top_k,
        })
    }

    /// The candidates of a block of one sequence: `hidden` `(1, P, H)` and its `logits` `(1,
    /// P, V)`.
    pub fn candidates(&self, hidden: &Array, logits: &Array) -> Result<Candidates> {
        let logits = logits.index(0);
        let k = self.top_k;
        let tokens = ops::argpartition_axis(&logits, -k, -1)?.index((.., -k..));
        let unary = logits.take_along_axis(&tokens, -1)?;
        let hidden = self.hidden_projection.forward(&hidden.index(0))?;
        Ok(Candidates {
            tokens,
            unary,
            hidden,
        })
    }

    /// The scores `(1, k)` of position `i`'s candidates after the guess `predecessor` `(1,)`.
    pub fn scores(&self, c: &Candidates, i: i32, predecessor: &Array) -> Result<Array> {
        let before = self.predecessor.forward(predecessor)?.expand_dims(1)?;
        let here = c.hidden.index((i..i + 1, ..)).expand_dims(1)?;
        let after = self.successor.forward(&c.tokens.index((i..i + 1, ..)))?;
        let edges = before
            .multiply(&here)?
            .multiply(&after)?
            .sum_axis(-1, None)?;
        c.unary.index((i..i + 1, ..)).add(edges)
    }
}

/// A DFlash2 drafter's config fields (under `dflash_config`, or at the top level).
pub struct Dflash2Fields {
    pub conv_kernel: i32,
    pub conv_group: i32,
    pub top_k: i32,
    pub input_scale: f32,
    pub output_multiplier: f32,
}

impl Dflash2Fields {
    pub fn read(field: &dyn Fn(&str) -> Option<f64>) -> Option<Self> {
        Some(Self {
            conv_kernel: field("conv_kernel_size")? as i32,
            conv_group: field("conv_group_size")? as i32,
            top_k: field("selector_top_k")? as i32,
            input_scale: field("input_embedding_scale").unwrap_or(1.0) as f32,
            output_multiplier: field("output_multiplier").unwrap_or(1.0) as f32,
        })
    }
}
