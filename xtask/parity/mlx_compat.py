"""Lets mlx-lm 0.32.2 run quantized mixture-of-experts models on MLX 0.32.2.

mlx-lm 0.32.2's `QuantizedSwitchLinear` calls `mx.gather_qmm(..., global_scale=...)`, a keyword
MLX 0.32.2's `gather_qmm` does not take: every quantized MoE model fails in mlx-lm itself with a
TypeError. The value it passes is the layer's `global_scale`, which is None for affine
quantization (mlx-lm sets one only for `nvfp4` experts quantized with a per-expert tensor
scale), and a None `global_scale` is the call without it. So `install()` puts a `gather_qmm`
in place that drops a None `global_scale` and refuses any other value; nothing else changes.
On an MLX whose `gather_qmm` takes `global_scale` it does nothing.
See docs/decisions/moe.md.
"""

import mlx.core as mx

_GATHER_QMM = mx.gather_qmm


def _gather_qmm(*args, global_scale=None, **kwargs):
    if global_scale is not None:
        raise NotImplementedError(
            "gather_qmm with a global_scale (nvfp4 experts) needs an MLX that takes it"
        )
    return _GATHER_QMM(*args, **kwargs)


def install():
    signature = (_GATHER_QMM.__doc__ or "").split("\n", 1)[0]
    if "global_scale" not in signature:
        mx.gather_qmm = _gather_qmm
