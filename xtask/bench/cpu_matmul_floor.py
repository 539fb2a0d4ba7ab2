"""The matmuls of one SmolLM2-135M decode step on the CPU, at 1, 2, 4 and 8 rows: the floor of a
batched step's time when every row must keep the bits it has alone (MLX's CPU matmul is one
OpenBLAS sgemm per product, which packs the weight panel on every call, also for one row).
Random float32 weights with SmolLM2's shapes (30 layers: q, k, v, o, gate, up, down; the head).
W rows at most (time at W / time at 1) x W ... the ideal aggregate speed-up of W streams over one
if nothing but these products cost.

Usage: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 .venv/bin/python xtask/bench/cpu_matmul_floor.py
"""
import statistics
import time

import mlx.core as mx

mx.set_default_device(mx.cpu)
HIDDEN, KV, FFN, VOCAB, LAYERS = 576, 192, 1536, 49152, 30
layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
weights = [[mx.random.normal(s) for s in layer] for _ in range(LAYERS)] + [[mx.random.normal((VOCAB, HIDDEN))]]
mx.eval(weights)
base = None
print("| rows | matmuls per step ms (median of 7) | x one row | streams / step-time ratio |")
print("|---|---|---|---|")
for rows in (1, 2, 4, 8):
    x = {HIDDEN: mx.random.normal((rows, HIDDEN)), FFN: mx.random.normal((rows, FFN))}
    mx.eval(x)
    times = []
    for _ in range(8):
        t = time.perf_counter()
        for ws in weights:
            for w in ws:
                mx.eval(x[w.shape[1]] @ w.T)
        times.append(time.perf_counter() - t)
    ms = statistics.median(times[1:]) * 1000
    base = base or ms
    print(f"| {rows} | {ms:.1f} | {ms / base:.2f} | {rows * base / ms:.2f}x |")
