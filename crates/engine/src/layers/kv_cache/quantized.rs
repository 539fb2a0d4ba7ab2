//! A full-attention cache stored quantized (`kv_bits`): mlx-lm's `QuantizedKVCache`, and the
//! attention over it (`quantized_scaled_dot_product_attention`), op for op.
//!
//! A plain cache becomes one of these after a forward pass (mlx-lm's `maybe_quantize_kv_cache`
//! with `quantized_kv_start = 0`): its whole storage is quantized at once, then every new key
//! and value is quantized as it is written.

use mlx_rs::{
    ops::{self, indexing::IndexOp, indexing::TryIndexMutOp},
    Array, Dtype,
};

use super::{
    mask::Mask,
    standard::{StandardCache, STEP},
};
use crate::layers::array::Result;

/// Affine-quantized `(B, H, S, D)` rows: packed values, scales and biases per group.
#[derive(Clone)]
pub struct Quantized {
    data: Array,
    scales: Array,
    biases: Array,
}

impl Quantized {
    fn of(x: &Array, group_size: i32, bits: i32) -> Result<Self> {
        let (data, scales, biases) = ops::quantize(x, group_size, bits)?;
        Ok(Self {
            data,
            scales,
            biases,
        })
    }

    fn parts(&self) -> [&Array; 3] {
        [&self.data, &self.scales, &self.biases]
    }

    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Self> {
        Ok(Self {
            data: f(&self.data)?,
            scales: f(&self.scales)?,
            biases: f(&self.biases)?,
        })
    }

    /// Writes `new` into positions `from..from + len`.
    fn write(&mut self, from: i32, new: &Self) -> Result<()> {
        let len = new.data.dim(2);
        for (dst, src) in [
            (&mut self.data, &new.data),
            (&mut self.scales, &new.scales),
            (&mut self.biases, &new.biases),
        ] {
            dst.try_index_mut((.., .., from..from + len, ..), src)?;
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct QuantizedCache {
    keys: Option<Quantized>,
    values: Option<Quantized>,
    offset: i32,
    group_size: i32,
    bits: i32,
}

impl QuantizedCache {
    /// `cache`'s storage quantized as it stands (capacity included), as mlx-lm's `to_quantized`.
    pub fn from_standard(cache: &StandardCache, group_size: i32, bits: i32) -> Result<Self> {
        let (keys, values) = match cache.storage() {
            Some((k, v)) => (
                Some(Quantized::of(k, group_size, bits)?),
                Some(Quantized::of(v, group_size, bits)?),
            ),
            None => (None, None),
        };
        Ok(Self {
            keys,
            values,
            offset: cache.offset(),
            group_size,
            bits,
        })
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Forgets the last `n` positions (later writes overwrite them).
    pub fn trim(&mut self, n: i32) -> bool {
        self.offset -= n.clamp(0, self.offset);
        true
    }

    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flat_map(|q| q.parts())
    }

    /// Quantizes and appends `(B, H, L, D)` keys and values, then attends to everything cached
    /// from queries `q` `(B, Hq, L, D)`. Returns `(B, Hq, L, D)`.
    pub fn update_and_attend(
        &mut self,
        q: &Array,
        k: Array,
        v: Array,
        scale: f32,
        mask: &Mask,
    ) -> Result<Array> {
        let (keys, values) = self.update_and_fetch(&k, &v)?;
        self.attend(q, &keys, &values, scale, mask)
    }

    fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Quantized, Quantized)> {
        let (b, heads, len) = (k.dim(0), k.dim(1), k.dim(2));
        let prev = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |q| q.data.dim(2));
        if self.keys.is_none() || prev + len > capacity {
            let steps = (STEP + len - 1) / STEP * STEP;
            let per_word = 32 / self.bits;
            let zeros = |last: i32, dtype: Dtype| ops::zeros_dtype(&[b, heads, steps, last], dtype);
            let fresh = |x: &Array| -> Result<Quantized> {
                let d = x.dim(3);
                Ok(Quantized {
                    data: zeros(d / per_word, Dtype::Uint32)?,
                    scales: zeros(d / self.group_size, x.dtype())?,
                    biases: zeros(d / self.group_size, x.dtype())?,
                })
            };
            let grow = |old: &Quantized| -> Result<Quantized> {
                let old = match prev % STEP {
                    0 => old.clone(),
                    _ => old.map(|x| Ok(x.index((.., .., ..prev, ..))))?,
                };
                old.map(|x| {
                    let tail = zeros(x.dim(3), x.dtype())?;
                    ops::concatenate(&[x.clone(), tail], 2)
                })
            };
            let (keys, values) = match (&self.keys, &self.values) {
                (Some(keys), Some(values)) => (grow(keys)?, grow(values)?),
                _ => (fresh(k)?, fresh(v)?),
            };
            self.keys = Some(keys);
            self.values = Some(values);
        }
        self.offset += len;
        let new_k = Quantized::of(k, self.group_size, self.bits)?;
        let new_v = Quantized::of(v, self.group_size, self.bits)?;
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        keys.write(prev, &new_k)?;
        values.write(prev, &new_v)?;
        let offset = self.offset;
        let written = |q: &Quantized| match offset == q.data.dim(2) {
            true => Ok(q.clone()),
            false => q.map(|x| Ok(x.index((.., .., ..offset, ..)))),
        };
        Ok((written(keys)?, written(values)?))
    }

    /// mlx-lm's `quantized_scaled_dot_product_attention`.
    fn attend(
        &self,
        q: &Array,
        keys: &Quantized,
        values: &Quantized,
        scale: f32,
        mask: &Mask,
    ) -> Result<Array> {
        let (b, n_q_heads, l, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
        let n_kv_heads = keys.data.dim(-3);
        let repeats = n_q_heads / n_kv_heads;
        // `queries *= scale`: a Python float takes the array's dtype.
        let mut q = q.multiply(Array::from_f32(scale).as_dtype(q.dtype())?)?;
        let (mut keys, mut values) = (keys.clone(), values.clone());
        if repeats > 1 {
            q = q.reshape(&[b, n_kv_heads, repeats, l, d])?;
            keys = keys.map(|x| x.expand_dims(-3))?;
            values = values.map(|x| x.expand_dims(-3))?;
        }
        let [kd, ks, kb] = keys.parts();
        let mut scores = ops::quantized_matmul(&q, kd, ks, kb, true, self.group_size, self.bits)?;
        let explicit = match mask {
            Mask::None => None,
            // The causal mask of the last `L` of `S` positions.
            Mask::Causal => {
                let (ql, kl) = (scores.dim(-2), scores.dim(-1));
                Some(super::mask::causal_mask(ql, kl - ql, None))
            }
            Mask::Array(m) => Some(m.clone()),
        };
        if let Some(m) = explicit {
            let lowest = Array::from_f32(crate::layers::sdpa::lowest_of(scores.dtype()))
                .as_dtype(scores.dtype())?;
            scores = ops::select(&m, &scores, &lowest)?;
        }
        let scores = ops::softmax_axis(&scores, -1, true)?;
        let [vd, vs, vb] = values.parts();
        let out = ops::quantized_matmul(&scores, vd, vs, vb, false, self.group_size, self.bits)?;
        match repeats > 1 {
            true => out.reshape(&[b, n_q_heads, l, d]),
            false => Ok(out),
        }
    }
}
