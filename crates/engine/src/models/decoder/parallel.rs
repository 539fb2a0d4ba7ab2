//! A decoder split over a group (`layers/parallel.rs`): the layers a pipeline stage builds, a
//! tensor-parallel block's shards, an untied head split by vocabulary.

use std::rc::Rc;

use super::{
    block::{Block, Mixer, Mlp, TensorReduce},
    family::Family,
    model::Decoder,
    spec::LayerSpec,
};
use crate::{
    error::EngineError,
    layers::distributed::Group,
    layers::parallel::Parallel,
    layers::parallel::{self, Placement},
    layers::{GateUp, QkNorm, Qkv},
};

type LoadResult<T> = std::result::Result<T, EngineError>;

impl<F: Family> Decoder<F> {
    /// Under tensor parallel, an untied head whose vocabulary the ranks divide keeps this rank's
    /// share of its rows (a tied head is the embedding table, which every rank holds whole).
    pub(super) fn split_vocabulary(&mut self) -> LoadResult<()> {
        let tensor = self
            .placement
            .as_ref()
            .filter(|p| p.mode == Parallel::Tensor);
        let (Some(p), Some(head)) = (tensor, self.lm_head.as_mut()) else {
            return Ok(());
        };
        if head.weight.dim(0) % p.group.size() as i32 != 0 {
            return Ok(());
        }
        head.shard_rows(&p.group, "lm_head")?;
        self.vocab_split = Some(p.group.clone());
        Ok(())
    }
}

/// The layers this rank builds: a pipeline stage's, else all. A pipeline hands the hidden
/// state between ranks only: layers that reach into other layers (KV sharing, per-layer
/// inputs) stay on one rank.
pub(super) fn stage(
    placement: Option<&Placement>,
    layers: &[LayerSpec],
    per_layer_inputs: bool,
) -> LoadResult<std::ops::Range<usize>> {
    let Some(p) = placement.filter(|p| p.mode == Parallel::Pipeline) else {
        return Ok(0..layers.len());
    };
    parallel::check_stage(p, layers.len())?;
    if per_layer_inputs || layers.iter().any(|l| l.kv_from.is_some()) {
        return Err(parallel::refuse(
            "this model's layers read other layers' keys or per-layer inputs, which a \
             pipeline does not hand between ranks",
        ));
    }
    Ok(p.stage(layers.len()))
}

/// Splits a block's heads and MLP columns over the group (tensor parallel, as mlx-lm's
/// `shard` methods): softmax attention with separate q/k/v and a dense gated MLP with
/// separate gate/up only; the rest is refused, never run unsplit.
pub(super) fn shard_block(
    block: &mut Block,
    group: &Rc<Group>,
    p: &str,
    per_layer_inputs: bool,
) -> LoadResult<()> {
    let refused = |what: &str| {
        parallel::refuse(format!(
            "tensor parallel splits attention heads and dense MLPs; `{p}` has {what}: use \
             parallel \"pipeline\""
        ))
    };
    if block.kv_from.is_some() || per_layer_inputs {
        return Err(refused("KV sharing or a per-layer input gate"));
    }
    let a = match &mut block.mixer {
        Mixer::SelfAttn(a) => a,
        Mixer::LinearAttn(_) | Mixer::KimiDelta(_) => return Err(refused("linear attention")),
        Mixer::ShortConv(_) => return Err(refused("short convolutions")),
        Mixer::Mamba(_) => return Err(refused("a Mamba state-space layer")),
        Mixer::Mamba2(_) | Mixer::AttentionAndMamba(_) => {
            return Err(refused("a Mamba2 state-space layer"))
        }
        Mixer::None => return Err(refused("no attention")),
        Mixer::Latent(_) => return Err(refused("multi-head latent attention")),
    };
    let Mlp::Dense(mlp) = &mut block.mlp else {
        return Err(refused("a mixture of experts"));
    };
    if matches!(a.qk_norm, Some(QkNorm::Whole(..))) {
        return Err(refused("a query/key norm over all heads at once"));
    }
    let n = group.size() as i32;
    if a.shape.n_heads % n != 0 || a.shape.n_kv_heads % n != 0 {
        return Err(parallel::refuse(format!(
            "{} attention heads and {} key/value heads cannot be split over {n} ranks: use a \
             number of ranks that divides both, or parallel \"pipeline\"",
            a.shape.n_heads, a.shape.n_kv_heads
        )));
    }
    let Qkv::Split {
        q_proj,
        k_proj,
        v_proj,
    } = &mut a.qkv
    else {
        return Err(refused("fused projections"));
    };
    q_proj.shard_rows(group, &format!("{p}.self_attn.q_proj"))?;
    k_proj.shard_rows(group, &format!("{p}.self_attn.k_proj"))?;
    v_proj.shard_rows(group, &format!("{p}.self_attn.v_proj"))?;
    if let Some(sinks) = &a.sinks {
        a.sinks = Some(parallel::part(
            sinks,
            0,
            group,
            &format!("{p}.self_attn.sinks"),
        )?);
    }
    a.shape.n_heads /= n;
    a.shape.n_kv_heads /= n;
    let attention = a
        .o_proj
        .shard_columns(group, &format!("{p}.self_attn.o_proj"))?;
    let GateUp::Split { gate_proj, up_proj } = &mut mlp.gate_up else {
        return Err(refused("a fused gate/up projection"));
    };
    gate_proj.shard_rows(group, &format!("{p}.mlp.gate_proj"))?;
    up_proj.shard_rows(group, &format!("{p}.mlp.up_proj"))?;
    let mlp = mlp
        .down_proj
        .shard_columns(group, &format!("{p}.mlp.down_proj"))?;
    block.tensor = Some(TensorReduce { attention, mlp });
    Ok(())
}
