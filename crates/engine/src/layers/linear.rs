//! `y = x W^T (+ b)`: dense or quantized weights, an optional adapter, a rank's part of a split.

use mlx_rs::{ops, Array};

use std::rc::Rc;

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::{
        array::Result,
        distributed::Group,
        lora::Lora,
        parallel::{part, Reduce, Split},
        quantized::Quantized,
    },
};

/// Refuses the first of `expected` (a layer's name under `prefix`, the layer, the `(out, in)`
/// config.json implies) of another size: it would fail, or compute garbage, mid-forward.
/// `sizes` says which of config.json's sizes imply them.
pub fn check_dims(
    prefix: &str,
    expected: &[(&str, &Linear, (i32, i32))],
    sizes: &str,
) -> std::result::Result<(), EngineError> {
    for &(name, linear, (out, inputs)) in expected {
        let (o, i) = linear.dims();
        if (o, i) != (out, inputs) {
            return Err(EngineError::load(
                LoadErrorKind::InvalidWeights,
                format!(
                    "`{prefix}.{name}` is {o}x{i} but config.json implies {out}x{inputs} \
                     ({sizes}): config.json does not describe these weights"
                ),
            ));
        }
    }
    Ok(())
}

/// `y = x W^T (+ b)`, with `W` dense or quantized.
#[derive(Debug)]
pub struct Linear {
    pub weight: Array,
    pub bias: Option<Array>,
    pub quantized: Option<Quantized>,
    /// A LoRA or DoRA adapter's update, applied while its switch is on.
    pub lora: Option<Box<Lora>>,
    /// This rank's part of the layer, when tensor parallel split it over a group.
    pub split: Option<Split>,
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match &self.lora {
            Some(lora) if lora.is_on() => self.forward_adapted(lora, x),
            _ => self.forward_base(x),
        }
    }

    /// The output with `lora`'s update. DoRA (mlx-lm's `DoRALinear`): the base through its
    /// dequantized weight, the low-rank term added, the rows rescaled, then the bias.
    fn forward_adapted(&self, lora: &Lora, x: &Array) -> Result<Array> {
        let Some(norm_scale) = lora.dora() else {
            return lora.add_low_rank(x, self.forward_base(x)?);
        };
        let y = x.matmul(self.dense_weight()?.t())?;
        let y = (norm_scale.as_dtype(x.dtype())?).multiply(lora.add_low_rank(x, y)?)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// `x W^T + b` without the adapter.
    pub(crate) fn forward_base(&self, x: &Array) -> Result<Array> {
        let y = match &self.quantized {
            Some(q) => q.matmul(x, &self.weight, true)?,
            None => {
                if let Some(b) = &self.bias {
                    return ops::addmm(b, x, self.weight.t(), None, None);
                }
                x.matmul(self.weight.t())?
            }
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// The weight as a dense `(out, in)` matrix, dequantized if it is quantized.
    pub fn dense_weight(&self) -> Result<Array> {
        match &self.quantized {
            Some(q) => q.dequantize(&self.weight),
            None => Ok(self.weight.clone()),
        }
    }

    /// `(out, in)` features, as the dense weight's shape (a quantized weight packs `32 / bits`
    /// inputs per stored element).
    pub fn dims(&self) -> (i32, i32) {
        let (out, stored_in) = (self.weight.dim(0), self.weight.dim(-1));
        match &self.quantized {
            Some(q) => (out, stored_in * 32 / q.bits),
            None => (out, stored_in),
        }
    }

    /// The arrays the layer holds: weight, bias, quantization scales and biases.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = vec![&self.weight];
        out.extend(&self.bias);
        if let Some(q) = &self.quantized {
            out.extend(q.arrays());
        }
        out
    }

    /// Quantizes a dense layer in place (affine), as `load_in_4bit` asks.
    pub fn quantize(&mut self, group_size: i32, bits: i32) -> Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let (w, scales, biases) = ops::quantize(&self.weight, group_size, bits)?;
        self.weight = w;
        self.quantized = Some(Quantized {
            scales,
            biases: Some(biases),
            group_size,
            bits,
            mode: crate::layers::quantized::QuantMode::Affine,
        });
        Ok(())
    }

    /// Keeps this rank's output rows of this layer (its heads or MLP columns).
    pub fn shard_rows(
        &mut self,
        group: &Group,
        name: &str,
    ) -> std::result::Result<(), EngineError> {
        self.weight = part(&self.weight, 0, group, name)?;
        if let Some(b) = &self.bias {
            self.bias = Some(part(b, 0, group, name)?);
        }
        if let Some(q) = &mut self.quantized {
            q.scales = part(&q.scales, 0, group, name)?;
            if let Some(b) = &q.biases {
                q.biases = Some(part(b, 0, group, name)?);
            }
        }
        self.split = Some(Split::Rows {
            rank: group.rank(),
            size: group.size(),
        });
        Ok(())
    }

    /// Keeps this rank's input columns of this layer; its output must then go through the returned
    /// [`Reduce`]. A quantized weight splits by whole groups.
    pub fn shard_columns(
        &mut self,
        group: &Rc<Group>,
        name: &str,
    ) -> std::result::Result<Reduce, EngineError> {
        self.weight = part(&self.weight, -1, group, name)?;
        if let Some(q) = &mut self.quantized {
            q.scales = part(&q.scales, -1, group, name)?;
            if let Some(b) = &q.biases {
                q.biases = Some(part(b, -1, group, name)?);
            }
        }
        self.split = Some(Split::Columns {
            rank: group.rank(),
            size: group.size(),
        });
        Ok(Reduce::new(group.clone(), self.bias.take()))
    }
}
