//! A LoRA or DoRA update of one linear layer (mlx-lm's `LoRALinear`, unfused `DoRALinear` and
//! `LoRASwitchLinear`), and the switch that turns an adapter's updates off for one generation.
//! Reading adapters from disk and attaching them to a model's layers: `adapter.rs`.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use mlx_rs::{ops, Array};

use crate::layers::array::Result;

/// Turns every layer of one adapter on or off at once.
#[derive(Debug, Clone)]
pub struct AdapterSwitch(Arc<AtomicBool>);

impl AdapterSwitch {
    pub(crate) fn new() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One layer's update: LoRA's low-rank term, and with DoRA the rescaling of every output row.
#[derive(Debug)]
pub struct Lora {
    /// `(in, r)`; on stacked experts `(experts, in, r)`.
    a: Array,
    /// `(r, out)`; on stacked experts `(experts, r, out)`.
    b: Array,
    scale: f32,
    /// DoRA: `m / ||W + scale (a b)^T||` per output row (float32), computed once at attach:
    /// it depends on weights only.
    dora: Option<Array>,
    switch: AdapterSwitch,
}

impl Lora {
    pub(crate) fn new(
        a: Array,
        b: Array,
        scale: f32,
        dora: Option<Array>,
        switch: AdapterSwitch,
    ) -> Self {
        Self {
            a,
            b,
            scale,
            dora,
            switch,
        }
    }

    pub fn is_on(&self) -> bool {
        self.switch.is_on()
    }

    /// With DoRA: each output row's scale, `m / ||W + scale (a b)^T||`.
    pub(crate) fn dora(&self) -> Option<&Array> {
        self.dora.as_ref()
    }

    /// `y + scale * (x a) b`, in `x`'s dtype (mlx-lm's `LoRALinear`).
    pub(crate) fn add_low_rank(&self, x: &Array, y: Array) -> Result<Array> {
        let z = x.matmul(&self.a)?.matmul(&self.b)?;
        self.add_scaled(x, y, &z)
    }

    /// Stacked experts' `y` (mlx-lm's `LoRASwitchLinear`): `y + scale * (x a[e]) b[e]` for the
    /// expert `e` each row of `indices` names, through the same gathered matmuls.
    pub fn add_to_experts(
        &self,
        x: &Array,
        y: Array,
        indices: &Array,
        sorted: bool,
    ) -> Result<Array> {
        let z = ops::gather_mm(x, &self.a, None, indices, sorted)?;
        let z = ops::gather_mm(&z, &self.b, None, indices, sorted)?;
        self.add_scaled(x, y, &z)
    }

    fn add_scaled(&self, x: &Array, y: Array, z: &Array) -> Result<Array> {
        y.add(
            weak_scale(self.scale, z)?
                .multiply(z)?
                .as_dtype(x.dtype())?,
        )
    }
}

/// A Python float times an array takes the array's dtype (MLX's weak scalars).
pub(crate) fn weak_scale(scale: f32, like: &Array) -> Result<Array> {
    Array::from_f32(scale).as_dtype(like.dtype())
}
