//! The gated MLP every decoder shares.

use mlx_rs::Array;

use crate::layers::{activation::Activation, array::Result, linear::Linear};

/// The up projections of an MLP: separate matrices, one fused `[gate; up]` (Phi-3), or no gate
/// (Nemotron-H: `down(act(up(x)))`).
#[derive(Debug)]
pub enum GateUp {
    Split { gate_proj: Linear, up_proj: Linear },
    Fused { gate_up_proj: Linear },
    Ungated { up_proj: Linear },
}

/// `down(act(gate(x)) * up(x))`, the MLP of almost every architecture here (or, ungated,
/// `down(act(up(x)))`).
#[derive(Debug)]
pub struct GatedMlp {
    pub gate_up: GateUp,
    pub down_proj: Linear,
    pub activation: Activation,
}

impl GatedMlp {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let h = match &self.gate_up {
            GateUp::Split { gate_proj, up_proj } => self
                .activation
                .gated(&gate_proj.forward(x)?, &up_proj.forward(x)?)?,
            GateUp::Fused { gate_up_proj } => {
                let parts = gate_up_proj.forward(x)?.split_equal(2, -1)?;
                self.activation.gated(&parts[0], &parts[1])?
            }
            GateUp::Ungated { up_proj } => self.activation.ungated(&up_proj.forward(x)?)?,
        };
        self.down_proj.forward(&h)
    }

    /// The linear layers under their checkpoint names (relative to `mlp.`).
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut out = match &mut self.gate_up {
            GateUp::Split { gate_proj, up_proj } => {
                vec![("gate_proj", gate_proj), ("up_proj", up_proj)]
            }
            GateUp::Fused { gate_up_proj } => vec![("gate_up_proj", gate_up_proj)],
            GateUp::Ungated { up_proj } => vec![("up_proj", up_proj)],
        };
        out.push(("down_proj", &mut self.down_proj));
        out
    }
}
