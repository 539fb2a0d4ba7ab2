//! The sparse mixture-of-experts MLP every MoE family here shares: a router (`gate`, a linear
//! layer) picks `top_k` experts per token and weighs them; the experts are one SwiGLU MLP each,
//! held stacked, `(experts, out, in)` per projection, and run through MLX's gathered matmuls
//! (`gather_mm`, `gather_qmm` when quantized) as mlx-lm's `SwitchGLU` does, never one expert at
//! a time. Hugging Face checkpoints store one matrix per expert: they are stacked at load
//! (mlx-lm's `sanitize`), and the per-expert tensors dropped, so every weight is held once.

use mlx_rs::{ops, Array, Dtype};

use crate::{
    error::{EngineError, LoadErrorKind},
    layers::weights::Weights,
    layers::{
        activation::Activation, array::scalar_like, array::Result, linear::Linear, mlp::GateUp,
        mlp::GatedMlp, quantized::Quantized,
    },
};

type LoadResult<T> = std::result::Result<T, EngineError>;

fn invalid(detail: String) -> EngineError {
    EngineError::load(LoadErrorKind::InvalidWeights, detail)
}

/// How the router's logits become experts and their weights, as each family's mlx-lm file
/// computes it (softmaxes are `precise`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over every expert, the top k of the probabilities (`argpartition(p, -k)[-k:]`),
    /// renormalised to sum to 1 when `norm_topk_prob` (Qwen3-MoE).
    SoftmaxTopK { norm_topk_prob: bool },
    /// The same, top k taken as `argpartition(-p, k - 1)[:k]` (OLMoE).
    SoftmaxNegTopK { norm_topk_prob: bool },
    /// Top k of the logits (`argpartition(-logits, k - 1)[:k]`), softmax over those k (Mixtral).
    TopKSoftmax,
    /// The same, top k taken as `argpartition(logits, -k)[-k:]` (GPT-OSS).
    TopKTailSoftmax,
    /// Sigmoid scores (float32) plus the router's learned `e_score_correction_bias` choose the
    /// experts (`argpartition(-s, k - 1)[:k]`), only within the best `topk_group` of `n_group`
    /// groups (a group's worth: the sum of its two best; the others' scores zeroed); the
    /// uncorrected scores weigh them, renormalised when `norm_topk_prob` (and k > 1), times
    /// `scaling` (GLM-4-MoE's `noaux_tc`); `sum_epsilon` is added to the sum renormalising
    /// them, where the family's file adds one (GLM-4.7-Flash's 1e-20).
    GroupedSigmoid {
        n_group: i32,
        topk_group: i32,
        norm_topk_prob: bool,
        scaling: f32,
        sum_epsilon: Option<f32>,
    },
    /// Kimi Linear's: as [`Routing::GroupedSigmoid`], but the sigmoid (or, `softmax`, a
    /// precise softmax) in the router's dtype, the layer's `e_score_correction_bias` cast to
    /// it, the renormalising sum plus 1e-20.
    KimiGrouped {
        softmax: bool,
        n_group: i32,
        topk_group: i32,
        norm_topk_prob: bool,
        scaling: f32,
    },
    /// Mistral 4's: softmax scores (float32) choose the experts within the best `topk_group` of
    /// `n_group` groups as [`Routing::GroupedSigmoid`] does (no correction bias) and weigh them,
    /// renormalised when `norm_topk_prob` (whatever k; the sum plus 1e-20), times `scaling`.
    GroupedSoftmax {
        n_group: i32,
        topk_group: i32,
        norm_topk_prob: bool,
        scaling: f32,
    },
    /// ERNIE 4.5's: softmax (or, `sigmoid`, a sigmoid) of the logits in float32, the top k
    /// (`argpartition(-p, k - 1)[:k]`), renormalised by their sum, at least 1e-12.
    Renormalised { sigmoid: bool },
    /// MiniMax's: the router run on the input cast to float32; sigmoid scores plus the layer's
    /// `e_score_correction_bias` choose the experts (`argpartition(-s, k - 1)[:k]`), the
    /// uncorrected scores weigh them, renormalised whatever k (the sum plus 1e-20), in the
    /// input's dtype.
    BiasedSigmoid,
    /// LFM2-MoE's: sigmoid scores in the input's dtype, plus the layer's `expert_bias` (in
    /// float32, where `expert_bias`) choose the experts (`argpartition(s, -k)[-k:]`); the
    /// uncorrected scores weigh them, renormalised when `norm_topk_prob` (the sum plus 1e-6),
    /// times `scaling`.
    SigmoidBiasChooses {
        expert_bias: bool,
        norm_topk_prob: bool,
        scaling: f32,
    },
    /// Llama 4's: the top k logits (`argpartition(-l, k - 1)[:k]`, k = 1); their sigmoid
    /// (float32, cast to the input's dtype) scales the input the chosen expert takes, whose
    /// output is not weighed again.
    SigmoidScalesInput,
    /// Gemma 4's `router`: the input RMS-normed (weight `router.scale * hidden^-0.5`) through
    /// `router.proj`, the top k logits (`argpartition(s, -k)[-k:]`), softmax over those k (not
    /// `precise`), each weight times its expert's `router.per_expert_scale`.
    ScaledNormTopK { rms_norm_eps: f32 },
}

/// A dense expert every token also goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    None,
    /// `shared_expert`, weighed by a sigmoid of its own gate `shared_expert_gate` (Qwen3-Next).
    Gated,
    /// `shared_experts`, added as it is (GLM-4-MoE).
    Plain,
    /// `shared_expert`, added as it is (Llama 4).
    Single,
    /// `shared_expert`, its gate and up projections fused as `gate_up_proj` (gate rows, then
    /// up), added as it is (Granite's `shared_mlp`, renamed).
    Fused,
}

/// The experts' projections as most Hugging Face checkpoints name them.
pub const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// A sparse MoE layer as a family's config describes it.
#[derive(Debug, Clone)]
pub struct MoeSpec {
    /// The layer's checkpoint name under the block: `mlp` (Qwen3-MoE, OLMoE, GPT-OSS),
    /// `block_sparse_moe` (Mixtral).
    pub name: &'static str,
    /// The router's name under the layer: `gate`, or GPT-OSS's `router`.
    pub router: &'static str,
    /// The stacked experts' name under the layer: mlx-lm's `switch_mlp`, or GPT-OSS's
    /// `experts`.
    pub stacked: &'static str,
    /// The experts' activation: SwiGLU, GPT-OSS's clamped one, or, ungated (no `gate_proj`;
    /// the shared expert's neither), Nemotron-H's `relu(x)²`.
    pub activation: Activation,
    pub num_experts: i32,
    pub top_k: i32,
    pub routing: Routing,
    /// The per-expert names of the gate, up and down projections in Hugging Face checkpoints
    /// (`experts.N.<name>`): `gate_proj`, `up_proj`, `down_proj`, or Mixtral's `w1`, `w3`, `w2`.
    pub expert_names: [&'static str; 3],
    /// Also a dense SwiGLU expert every token goes through.
    pub shared: Shared,
    /// The experts run in a smaller width: the input projected down (`fc1_latent_proj`), their
    /// weighed sum back up (`fc2_latent_proj`); router and shared expert take the input as it
    /// is (Nemotron 3 Super's latent MoE).
    pub latent: bool,
}

impl MoeSpec {
    /// The Qwen3 line's layer (`mlp`, softmax over every expert, the top k): Qwen3-MoE's, and
    /// with a shared expert Qwen3-Next's and Qwen3.5's.
    pub fn qwen3(num_experts: i32, top_k: i32, norm_topk_prob: bool, shared_expert: bool) -> Self {
        Self {
            shared: match shared_expert {
                true => Shared::Gated,
                false => Shared::None,
            },
            ..Self::switch_glu(
                "mlp",
                num_experts,
                top_k,
                Routing::SoftmaxTopK { norm_topk_prob },
                ["gate_proj", "up_proj", "down_proj"],
            )
        }
    }
}

impl MoeSpec {
    /// The layer as mlx-lm holds most: router `gate`, SwiGLU experts stacked as `switch_mlp`.
    /// DeepSeek-V3's experts (GLM-4-MoE's too): router `gate` and stacked experts
    /// `switch_mlp` under `mlp`, plus `shared_experts` added as they are where the config has
    /// them.
    pub fn deepseek(experts: i32, top_k: i32, routing: Routing, shared: bool) -> Self {
        Self {
            shared: if shared { Shared::Plain } else { Shared::None },
            ..Self::switch_glu("mlp", experts, top_k, routing, PROJECTIONS)
        }
    }

    pub fn switch_glu(
        name: &'static str,
        num_experts: i32,
        top_k: i32,
        routing: Routing,
        expert_names: [&'static str; 3],
    ) -> Self {
        Self {
            name,
            router: "gate",
            stacked: "switch_mlp",
            activation: Activation::Silu,
            num_experts,
            top_k,
            routing,
            expert_names,
            shared: Shared::None,
            latent: false,
        }
    }
}

/// One projection of every expert: a [`Linear`] whose weight is `(experts, out, in)` (packed
/// and with per-expert scales when quantized), bias `(experts, out)`; mlx-lm's `SwitchLinear`.
#[derive(Debug)]
pub struct SwitchLinear(pub Linear);

impl SwitchLinear {
    /// `x @ W[e].T (+ b[e])` for the expert `e` each row of `indices` names, plus a LoRA
    /// adapter's update while it is on; `x` broadcasts against `indices` over the batch axes
    /// (all but the last two).
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let l = &self.0;
        let y = match &l.quantized {
            Some(q) => q.gather_matmul(x, &l.weight, indices, sorted)?,
            None => ops::gather_mm(x, l.weight.swap_axes(-1, -2)?, None, indices, sorted)?,
        };
        let y = match &l.bias {
            Some(b) => y.add(b.take_axis(indices, 0)?.expand_dims(-2)?)?,
            None => y,
        };
        match &l.lora {
            Some(lora) if lora.is_on() => lora.add_to_experts(x, y, indices, sorted),
            _ => Ok(y),
        }
    }

    /// The stacked projection at `prefix` (`<prefix>.weight`, ...), or, in a Hugging Face
    /// checkpoint, the `num_experts` per-expert ones at `<experts>.N.<name>` stacked.
    fn load(
        weights: &mut Weights,
        prefix: &str,
        experts: &str,
        name: &str,
        num_experts: i32,
    ) -> LoadResult<Self> {
        if weights.names().any(|n| *n == format!("{prefix}.weight")) {
            return Ok(Self(weights.linear(prefix)?));
        }
        let per_expert = (0..num_experts)
            .map(|e| weights.linear(&format!("{experts}.{e}.{name}")))
            .collect::<LoadResult<Vec<Linear>>>()?;
        let stack = |part: fn(&Linear) -> Option<&Array>| -> LoadResult<Option<Array>> {
            let parts: Option<Vec<&Array>> = per_expert.iter().map(part).collect();
            let stacked = parts.map(|p| ops::stack(&p, 0)).transpose();
            stacked.map_err(|e| invalid(format!("stacking `{experts}.*.{name}`: {e}")))
        };
        let weight = stack(|l| Some(&l.weight))?.expect("every expert has a weight");
        let scales = stack(|l| l.quantized.as_ref().map(|q| &q.scales))?;
        let quantized = match (scales, &per_expert[0].quantized) {
            (Some(scales), Some(q)) => Some(Quantized {
                scales,
                biases: stack(|l| l.quantized.as_ref().and_then(|q| q.biases.as_ref()))?,
                group_size: q.group_size,
                bits: q.bits,
                mode: q.mode,
            }),
            _ => None,
        };
        Ok(Self(Linear {
            weight,
            bias: stack(|l| l.bias.as_ref())?,
            quantized,
            lora: None,
            split: None,
        }))
    }
}

/// The experts: `down(act(gate(x), up(x)))` per chosen expert (mlx-lm's `SwitchGLU`), or
/// without a gate `down(act(up(x)))` (its `SwitchMLP`).
#[derive(Debug)]
pub struct SwitchGlu {
    pub gate_proj: Option<SwitchLinear>,
    pub up_proj: SwitchLinear,
    pub down_proj: SwitchLinear,
    pub activation: Activation,
}

/// From this many (token, expert) pairs on, the pairs are sorted by expert before the gathered
/// matmuls (mlx-lm's threshold; `sorted_indices` lets MLX take each expert's rows together).
const SORT_FROM: usize = 64;

impl SwitchGlu {
    /// `(..., D)` tokens and `(..., k)` expert indices -> `(..., k, D)`, one output per expert.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        if indices.size() < SORT_FROM {
            return self.experts(&x, indices, false)?.squeeze_axes(&[-2]);
        }
        // Sort the (token, expert) pairs by expert, run, and put the rows back in order.
        let k = indices.dim(-1);
        let flat = indices.flatten(None, None)?;
        let order = ops::argsort_axis(&flat, 0)?;
        let inv_order = ops::argsort_axis(&order, 0)?;
        let rows = order.floor_divide(Array::from_int(k).as_dtype(order.dtype())?)?;
        let x = x.flatten(0, -3)?.take_axis(&rows, 0)?;
        let y = self.experts(&x, &flat.take_axis(&order, 0)?, true)?;
        let y = y.take_axis(&inv_order, 0)?;
        ops::unflatten(&y, 0, indices.shape())?.squeeze_axes(&[-2])
    }

    fn experts(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let up = self.up_proj.forward(x, indices, sorted)?;
        let h = match &self.gate_proj {
            Some(gate) => {
                let gate = gate.forward(x, indices, sorted)?;
                self.activation.gated(&gate, &up)?
            }
            None => self.activation.ungated(&up)?,
        };
        self.down_proj.forward(&h, indices, sorted)
    }
}

/// The expert every token goes through, `mlp(x)` or `sigmoid(gate(x)) * mlp(x)`, added to the
/// routed experts' sum.
#[derive(Debug)]
pub struct SharedExpert {
    /// `shared_expert` or `shared_experts`.
    name: &'static str,
    pub mlp: GatedMlp,
    /// `hidden -> 1`.
    pub gate: Option<Linear>,
}

impl SharedExpert {
    fn load(
        weights: &mut Weights,
        prefix: &str,
        kind: Shared,
        activation: Activation,
    ) -> LoadResult<Option<Self>> {
        let name = match kind {
            Shared::None => return Ok(None),
            Shared::Gated => "shared_expert",
            Shared::Plain => "shared_experts",
            Shared::Single | Shared::Fused => "shared_expert",
        };
        let mut linear = |part: &str| weights.linear(&format!("{prefix}.{name}.{part}"));
        let mlp = match activation {
            Activation::Relu2 => GatedMlp {
                gate_up: GateUp::Ungated {
                    up_proj: linear("up_proj")?,
                },
                down_proj: linear("down_proj")?,
                activation,
            },
            _ if kind == Shared::Fused => GatedMlp {
                gate_up: GateUp::Fused {
                    gate_up_proj: linear("gate_up_proj")?,
                },
                down_proj: linear("down_proj")?,
                activation: Activation::Silu,
            },
            _ => GatedMlp {
                gate_up: GateUp::Split {
                    gate_proj: linear("gate_proj")?,
                    up_proj: linear("up_proj")?,
                },
                down_proj: linear("down_proj")?,
                activation: Activation::Silu,
            },
        };
        let gate = match kind {
            Shared::Gated => Some(weights.linear(&format!("{prefix}.shared_expert_gate"))?),
            _ => None,
        };
        Ok(Some(Self { name, mlp, gate }))
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        match &self.gate {
            Some(gate) => ops::sigmoid(gate.forward(x)?)?.multiply(self.mlp.forward(x)?),
            None => self.mlp.forward(x),
        }
    }
}

/// Router plus experts: the MLP of a sparse MoE layer.
#[derive(Debug)]
pub struct SparseMoe {
    /// The router, `hidden -> experts` logits.
    pub gate: Linear,
    /// The router's and the stacked experts' checkpoint names ([`MoeSpec`]).
    names: (&'static str, &'static str),
    pub switch_mlp: SwitchGlu,
    pub top_k: i32,
    pub routing: Routing,
    /// The router's (or the layer's) `e_score_correction_bias` (`(E,)`), for
    /// [`Routing::GroupedSigmoid`] and [`Routing::BiasedSigmoid`]; the layer's `expert_bias`
    /// for [`Routing::SigmoidBiasChooses`].
    correction_bias: Option<Array>,
    /// The router's input norm weight and per-expert scales, for [`Routing::ScaledNormTopK`].
    router_scales: Option<Box<(Array, Array)>>,
    pub shared_expert: Option<Box<SharedExpert>>,
    /// [`MoeSpec::latent`]'s projections, down and up.
    latent: Option<Box<(Linear, Linear)>>,
}

impl SparseMoe {
    /// The layer at `prefix` (`model.layers.N.mlp`): the router and stacked experts under
    /// their names in `spec`.
    pub fn load(weights: &mut Weights, prefix: &str, spec: &MoeSpec) -> LoadResult<Self> {
        let (experts, k) = (spec.num_experts, spec.top_k);
        if experts < 1 || k < 1 || k > experts {
            return Err(invalid(format!(
                "config.json: {k} experts per token of {experts} (need 1 <= k <= experts)"
            )));
        }
        let [gate, up, down] = spec.expert_names;
        let mut switch = |ours: &str, theirs: &str| {
            SwitchLinear::load(
                weights,
                &format!("{prefix}.{}.{ours}", spec.stacked),
                &format!("{prefix}.experts"),
                theirs,
                spec.num_experts,
            )
        };
        let gated = spec.activation != Activation::Relu2;
        let switch_mlp = SwitchGlu {
            gate_proj: match gated {
                true => Some(switch("gate_proj", gate)?),
                false => None,
            },
            up_proj: switch("up_proj", up)?,
            down_proj: switch("down_proj", down)?,
            activation: spec.activation,
        };
        let gate = weights.linear(&format!("{prefix}.{}", spec.router))?;
        // MLX's gathers do not check bounds: every expert index the router gives must exist.
        let projections = [&switch_mlp.up_proj, &switch_mlp.down_proj];
        let projections = projections.into_iter().chain(&switch_mlp.gate_proj);
        if gate.weight.dim(0) != experts
            || projections
                .into_iter()
                .any(|p| p.0.weight.dim(0) != experts)
        {
            return Err(invalid(format!(
                "`{prefix}`: the router and experts do not hold the {experts} experts config.json \
                 names"
            )));
        }
        if spec.routing == Routing::SigmoidScalesInput && k != 1 {
            return Err(invalid(format!(
                "config.json: {k} experts per token; this router takes 1 (as mlx-lm's llama4.py)"
            )));
        }
        let shared_expert =
            SharedExpert::load(weights, prefix, spec.shared, spec.activation)?.map(Box::new);
        if let Routing::GroupedSigmoid {
            n_group,
            topk_group,
            ..
        }
        | Routing::KimiGrouped {
            n_group,
            topk_group,
            ..
        }
        | Routing::GroupedSoftmax {
            n_group,
            topk_group,
            ..
        } = spec.routing
        {
            if n_group < 1 || experts % n_group != 0 || topk_group < 1 || topk_group > n_group {
                return Err(invalid(format!(
                    "config.json: {experts} experts in {n_group} groups, the best {topk_group} \
                     used (need groups that divide the experts, 1 <= topk_group <= n_group)"
                )));
            }
        }
        let correction_bias = match spec.routing {
            Routing::GroupedSigmoid { .. }
            | Routing::BiasedSigmoid
            | Routing::KimiGrouped { .. } => {
                let name = match spec.routing {
                    Routing::BiasedSigmoid | Routing::KimiGrouped { .. } => {
                        format!("{prefix}.e_score_correction_bias")
                    }
                    _ => format!("{prefix}.{}.e_score_correction_bias", spec.router),
                };
                let bias = weights.take(&name)?;
                if bias.shape() != [experts] {
                    return Err(invalid(format!("`{name}` is not one score per expert")));
                }
                Some(bias)
            }
            Routing::SigmoidBiasChooses {
                expert_bias: true, ..
            } => {
                let name = format!("{prefix}.expert_bias");
                let bias = weights.take(&name)?;
                if bias.shape() != [experts] {
                    return Err(invalid(format!("`{name}` is not one score per expert")));
                }
                Some(bias)
            }
            _ => None,
        };
        let router_scales = match spec.routing {
            Routing::ScaledNormTopK { .. } => {
                let router = spec.router.trim_end_matches(".proj");
                let scale = weights.take(&format!("{prefix}.{router}.scale"))?;
                let root = crate::layers::array::scalar_like(
                    (scale.dim(0) as f64).powf(-0.5) as f32,
                    &scale,
                );
                let norm = root.and_then(|r| scale.multiply(r));
                let norm = norm.map_err(|e| invalid(format!("`{prefix}.{router}.scale`: {e}")))?;
                let per_expert = weights.take(&format!("{prefix}.{router}.per_expert_scale"))?;
                if per_expert.shape() != [experts] {
                    return Err(invalid(format!(
                        "`{prefix}.{router}.per_expert_scale` is not one scale per expert"
                    )));
                }
                Some(Box::new((norm, per_expert)))
            }
            _ => None,
        };
        let latent = match spec.latent {
            true => Some(Box::new((
                weights.linear(&format!("{prefix}.fc1_latent_proj"))?,
                weights.linear(&format!("{prefix}.fc2_latent_proj"))?,
            ))),
            false => None,
        };
        Ok(Self {
            latent,
            gate,
            names: (spec.router, spec.stacked),
            switch_mlp,
            top_k: spec.top_k,
            routing: spec.routing,
            correction_bias,
            router_scales,
            shared_expert,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_routed(x, x)
    }

    /// The experts on `x`, chosen and weighed from `route_from` (Gemma 4 routes from the
    /// block's input and runs the experts on its own pre-norm of it).
    pub fn forward_routed(&self, route_from: &Array, x: &Array) -> Result<Array> {
        let route_from = match (&self.routing, &self.router_scales) {
            (Routing::ScaledNormTopK { rms_norm_eps }, Some(scales)) => {
                mlx_rs::fast::rms_norm(route_from, Some(&scales.0), *rms_norm_eps)?
            }
            _ => route_from.clone(),
        };
        let (indices, scores) = match self.routing {
            Routing::BiasedSigmoid => {
                let logits = self.gate.forward(&route_from.as_dtype(Dtype::Float32)?)?;
                let (indices, scores) = self.route(&logits)?;
                (indices, scores.as_dtype(x.dtype())?)
            }
            _ => self.route(&self.gate.forward(&route_from)?)?,
        };
        if self.routing == Routing::SigmoidScalesInput {
            let scaled = x.multiply(scores.as_dtype(x.dtype())?)?;
            let y = self
                .switch_mlp
                .forward(&scaled, &indices)?
                .squeeze_axes(&[-2])?;
            return self.add_shared(y, x);
        }
        let experts_input = match &self.latent {
            Some(l) => l.0.forward(x)?,
            None => x.clone(),
        };
        let y = self.switch_mlp.forward(&experts_input, &indices)?;
        // Qwen3-MoE casts back to `y`'s dtype; elsewhere it is already that dtype, but for
        // Gemma 4, whose weights may take another dtype from its per-expert scales (mlx-lm
        // does not cast there).
        let weighed = y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?;
        let y = match self.routing {
            Routing::ScaledNormTopK { .. } => weighed,
            _ => weighed.as_dtype(y.dtype())?,
        };
        let y = match &self.latent {
            Some(l) => l.1.forward(&y)?,
            None => y,
        };
        self.add_shared(y, x)
    }

    /// The routed experts' output `y` plus the shared expert's on `x`, if any.
    fn add_shared(&self, y: Array, x: &Array) -> Result<Array> {
        match &self.shared_expert {
            Some(shared) => y.add(shared.forward(x)?),
            None => Ok(y),
        }
    }

    /// Expert indices `(..., k)` and their weights `(..., k)` for router logits `(..., E)`.
    fn route(&self, logits: &Array) -> Result<(Array, Array)> {
        let k = self.top_k;
        let softmax = |x: &Array| ops::softmax_axis(x, -1, true);
        let renormalise = |s: Array, norm: bool| match norm {
            true => s.divide(s.sum_axis(-1, true)?),
            false => Ok(s),
        };
        match self.routing {
            Routing::SoftmaxTopK { norm_topk_prob } => {
                let probs = softmax(logits)?;
                let indices = last_k(&probs, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                Ok((indices, renormalise(scores, norm_topk_prob)?))
            }
            Routing::SoftmaxNegTopK { norm_topk_prob } => {
                let probs = softmax(logits)?;
                let indices = first_k_of_negated(&probs, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                Ok((indices, renormalise(scores, norm_topk_prob)?))
            }
            Routing::ScaledNormTopK { .. } => {
                let (_, per_expert) = &**self.router_scales.as_ref().expect("loaded with it");
                let indices = last_k(logits, k)?;
                let scores = ops::softmax_axis(&logits.take_along_axis(&indices, -1)?, -1, false)?;
                Ok((
                    indices.clone(),
                    scores.multiply(per_expert.take_axis(&indices, 0)?)?,
                ))
            }
            Routing::Renormalised { sigmoid } => {
                let logits = logits.as_dtype(Dtype::Float32)?;
                let probs = match sigmoid {
                    true => ops::sigmoid(&logits)?,
                    false => ops::softmax_axis(&logits, -1, false)?,
                };
                let indices = first_k_of_negated(&probs, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                let sum = ops::maximum(scores.sum_axis(-1, true)?, Array::from_f32(1e-12))?;
                Ok((indices, scores.divide(sum)?))
            }
            Routing::SigmoidScalesInput => {
                let indices = first_k_of_negated(logits, k)?;
                let chosen = logits.take_along_axis(&indices, -1)?;
                Ok((indices, ops::sigmoid(chosen.as_dtype(Dtype::Float32)?)?))
            }
            Routing::TopKSoftmax | Routing::TopKTailSoftmax => {
                let indices = match self.routing {
                    Routing::TopKSoftmax => first_k_of_negated(logits, k)?,
                    _ => last_k(logits, k)?,
                };
                let scores = softmax(&logits.take_along_axis(&indices, -1)?)?;
                Ok((indices, scores))
            }
            Routing::GroupedSigmoid {
                n_group,
                topk_group,
                norm_topk_prob,
                scaling,
                sum_epsilon,
            } => {
                let bias = self
                    .correction_bias
                    .as_ref()
                    .expect("loaded with this routing");
                let probs = ops::sigmoid(logits.as_dtype(Dtype::Float32)?)?;
                let chosen = best_groups(probs.add(bias)?, n_group, topk_group)?;
                let indices = first_k_of_negated(&chosen, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                let scores = match (norm_topk_prob && k > 1, sum_epsilon) {
                    (true, Some(eps)) => {
                        let sum = scores.sum_axis(-1, true)?.add(Array::from_f32(eps))?;
                        scores.divide(sum)?
                    }
                    (norm, _) => renormalise(scores, norm)?,
                };
                Ok((indices, scores.multiply(Array::from_f32(scaling))?))
            }
            Routing::KimiGrouped {
                softmax,
                n_group,
                topk_group,
                norm_topk_prob,
                scaling,
            } => {
                let bias = self.correction_bias.as_ref().expect("loaded with it");
                let probs = match softmax {
                    true => ops::softmax_axis(logits, -1, true)?,
                    false => ops::sigmoid(logits)?,
                };
                let biased = probs.add(bias.as_dtype(probs.dtype())?)?;
                let chosen = best_groups(biased, n_group, topk_group)?;
                let indices = first_k_of_negated(&chosen, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                let scores = match norm_topk_prob && k > 1 {
                    true => {
                        let sum = scores.sum_axis(-1, true)?;
                        scores.divide(sum.add(scalar_like(1e-20, &scores)?)?)?
                    }
                    false => scores,
                };
                Ok((indices, scores.multiply(scalar_like(scaling, &scores)?)?))
            }
            Routing::BiasedSigmoid => {
                let bias = self.correction_bias.as_ref().expect("loaded with it");
                let probs = ops::sigmoid(logits)?;
                let indices = first_k_of_negated(&probs.add(bias)?, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                let sum = scores.sum_axis(-1, true)?.add(Array::from_f32(1e-20))?;
                Ok((indices, scores.divide(sum)?))
            }
            Routing::SigmoidBiasChooses {
                norm_topk_prob,
                scaling,
                ..
            } => {
                let probs = ops::sigmoid(logits)?;
                let indices = match &self.correction_bias {
                    Some(bias) => last_k(&probs.as_dtype(Dtype::Float32)?.add(bias)?, k)?,
                    None => last_k(&probs, k)?,
                };
                let scores = probs.take_along_axis(&indices, -1)?;
                let scores = match norm_topk_prob {
                    true => {
                        let sum = scores.sum_axis(-1, true)?;
                        scores.divide(sum.add(scalar_like(1e-6, &scores)?)?)?
                    }
                    false => scores,
                };
                Ok((indices, scores.multiply(scalar_like(scaling, &scores)?)?))
            }
            Routing::GroupedSoftmax {
                n_group,
                topk_group,
                norm_topk_prob,
                scaling,
            } => {
                let probs = ops::softmax_axis(&logits.as_dtype(Dtype::Float32)?, -1, false)?;
                let chosen = best_groups(probs.clone(), n_group, topk_group)?;
                let indices = first_k_of_negated(&chosen, k)?;
                let scores = probs.take_along_axis(&indices, -1)?;
                let scores = match norm_topk_prob {
                    true => {
                        let sum = scores.sum_axis(-1, true)?.add(Array::from_f32(1e-20))?;
                        scores.divide(sum)?
                    }
                    false => scores,
                };
                Ok((indices, scores.multiply(Array::from_f32(scaling))?))
            }
        }
    }

    /// The linear layers under their checkpoint names (relative to the layer): the router and
    /// the expert projections (weights `(experts, out, in)`).
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let (router, stacked) = self.names;
        let s = &mut self.switch_mlp;
        let mut out = vec![];
        if let Some(gate) = &mut s.gate_proj {
            out.push((format!("{stacked}.gate_proj"), &mut gate.0));
        }
        out.push((format!("{stacked}.up_proj"), &mut s.up_proj.0));
        out.push((format!("{stacked}.down_proj"), &mut s.down_proj.0));
        // GLM-4-MoE's router is a plain matrix in mlx-lm (`MoEGate`), never quantized.
        if !matches!(self.routing, Routing::GroupedSigmoid { .. }) {
            out.insert(0, (router.to_owned(), &mut self.gate));
        }
        if let Some(latent) = &mut self.latent {
            let (down, up) = &mut **latent;
            out.push(("fc1_latent_proj".to_owned(), down));
            out.push(("fc2_latent_proj".to_owned(), up));
        }
        if let Some(shared) = &mut self.shared_expert {
            if let Some(gate) = &mut shared.gate {
                out.push(("shared_expert_gate".to_owned(), gate));
            }
            for (name, linear) in shared.mlp.linears_mut() {
                out.push((format!("{}.{name}", shared.name), linear));
            }
        }
        out
    }
}

/// How a checkpoint stores its fused experts (`experts.gate_up_proj`, `experts.down_proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedExperts {
    /// `(experts, 2 * moe, hidden)`, gate rows then up rows, and `(experts, hidden, moe)`: as
    /// the stacked experts, split (Qwen3.5-MoE, Gemma 4).
    Rows,
    /// `(experts, hidden, 2 * moe)`, gate columns then up columns, and `(experts, moe,
    /// hidden)`: transposed, then split (Llama 4, Qwen3-VL-MoE).
    Columns,
}

/// transformers' fused experts as mlx-lm's sanitizes split them: `<p>.experts.gate_up_proj`
/// into `<stacked(p)>.gate_proj.weight` (the first half) and `.up_proj.weight`,
/// `<p>.experts.down_proj` into `<stacked(p)>.down_proj.weight`, from `layout` (Qwen3.5-MoE:
/// `<p>.switch_mlp`; Gemma 4: `<p>.experts.switch_glu`; Llama 4: `<p>.experts`).
pub fn split_fused_experts(
    weights: &mut Weights,
    layout: FusedExperts,
    stacked: impl Fn(&str) -> String,
) -> LoadResult<()> {
    let fused: Vec<String> = weights
        .names()
        .filter(|n| n.ends_with(".experts.gate_up_proj"))
        .cloned()
        .collect();
    for name in fused {
        let target = stacked(name.trim_end_matches(".experts.gate_up_proj"));
        let down_name = name.replace("gate_up_proj", "down_proj");
        let as_stacked = |t: Array, name: &str| match layout {
            FusedExperts::Rows => Ok(t),
            FusedExperts::Columns => t
                .swap_axes(-2, -1)
                .map_err(|e| invalid(format!("`{name}`: {e}"))),
        };
        let gate_up = as_stacked(weights.take(&name)?, &name)?;
        let halves = gate_up
            .split_equal(2, -2)
            .map_err(|e| invalid(format!("`{name}`: {e}")))?;
        for (half, part) in halves.into_iter().zip(["gate_proj", "up_proj"]) {
            weights.insert(format!("{target}.{part}.weight"), half);
        }
        let down = as_stacked(weights.take(&down_name)?, &down_name)?;
        weights.insert(format!("{target}.down_proj.weight"), down);
    }
    Ok(())
}

/// `argpartition(x, -k)[..., -k:]`: the k largest of `x`, as Qwen3-MoE and GPT-OSS pick them.
fn last_k(x: &Array, k: i32) -> Result<Array> {
    let e = x.dim(-1);
    let part = ops::argpartition_axis(x, -k, -1)?;
    Ok(part.split_at_indices(&[e - k], -1)?.swap_remove(1))
}

/// `argpartition(-x, k - 1)[..., :k]`: the k largest of `x`, as Mixtral and OLMoE pick them.
/// `scores` `(..., E)` with every expert outside the best `topk_group` of `n_group` groups
/// zeroed (a group's worth: the sum of its two best scores), as mlx-lm's DeepSeek-style routers
/// do; unchanged with one group or none dropped.
fn best_groups(scores: Array, n_group: i32, topk_group: i32) -> Result<Array> {
    let dropped = n_group - topk_group;
    if n_group <= 1 || dropped <= 0 {
        return Ok(scores);
    }
    let e = scores.dim(-1);
    let grouped = ops::unflatten(&scores, -1, &[n_group, e / n_group])?;
    let worth = ops::indexing::topk_axis(&grouped, 2, -1)?.sum_axis(-1, true)?;
    let order = ops::argpartition_axis(&worth, dropped - 1, -2)?;
    let worst = order.split_at_indices(&[dropped], -2)?.swap_remove(0);
    grouped
        .put_along_axis(&worst, Array::from_f32(0.0), -2)?
        .flatten(-2, -1)
}

fn first_k_of_negated(x: &Array, k: i32) -> Result<Array> {
    let part = ops::argpartition_axis(x.negative()?, k - 1, -1)?;
    Ok(part.split_at_indices(&[k], -1)?.swap_remove(0))
}
