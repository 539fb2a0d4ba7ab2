"""Whether this machine's BLAS gives a row of a product the bits it gets alone, at SmolLM2's
shapes and up to 8 rows: what the end-to-end batching tests' bit-for-bit checks rest on.

Run with the worker's OpenBLAS preloaded (as parity runs mlx-lm), so MLX's float32 matmuls are
that library's. OpenBLAS picks its kernels by CPU: with its Haswell kernels (AMD EPYC) rows
agree; with its SkylakeX kernels (an Intel Xeon with AVX-512 IFMA, 2026-12-05) a row differs from
5 rows on (docs/traps.md). Prints `exact`, or `inexact` and the shapes that differ.
"""

import mlx.core as mx

mx.random.seed(0)
differ = []
for k, n in ((576, 1536), (576, 576), (1536, 576)):  # SmolLM2's projections (in, out)
    w = mx.random.normal((n, k))
    x = mx.random.normal((8, k))
    alone = x[:1] @ w.T
    for m in range(2, 9):
        together = (x[:m] @ w.T)[:1]
        if not mx.array_equal(alone, together).item():
            differ.append(f"{m}x{k} @ {k}x{n}")
print("exact" if not differ else "inexact: row 0 of " + ", ".join(differ))
