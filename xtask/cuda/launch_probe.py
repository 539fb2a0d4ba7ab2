"""Probe: how much fewer kernels per layer buy in single-stream decode on this GPU, in mlx-lm's
own decode loop (generate_step) on the same model. Variants of Llama's layer, alternated in
rounds: mlx-lm as released (SwiGLU compiled into one kernel); SwiGLU as three kernels (sigmoid,
multiply, multiply: the worker's form at the time); gate and up projections as one matmul; and
also q, k, v as one matmul. Prints decode tok/s medians per variant and whether the greedy
tokens equal the released variant's.

Usage: python3 launch_probe.py MODEL [ROUNDS] [TOKENS]"""
import statistics
import sys
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention

model, tok = load(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
n = int(sys.argv[3]) if len(sys.argv) > 3 else 256
prompt = mx.array(tok.encode("Tell me a long story about a fox who learns to read."))

released_mlp = llama.MLP.__call__
released_attn = llama.Attention.__call__


def plain_mlp(self, x):
    g = self.gate_proj(x)
    return self.down_proj(g * mx.sigmoid(g) * self.up_proj(x))


def fused_mlp(self, x):
    g, u = mx.split(x @ self.gate_up_t, 2, axis=-1)
    return self.down_proj(llama.swiglu(g, u))


def fused_attn(self, x, mask=None, cache=None):
    B, L, D = x.shape
    q_dim = self.n_heads * self.head_dim
    kv_dim = self.n_kv_heads * self.head_dim
    q, k, v = mx.split(x @ self.qkv_t, [q_dim, q_dim + kv_dim], axis=-1)
    q = q.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
    k = k.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q = self.rope(q, offset=cache.offset)
    k = self.rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
    return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


for layer in model.layers:
    m, a = layer.mlp, layer.self_attn
    m.gate_up_t = mx.concatenate([m.gate_proj.weight, m.up_proj.weight], axis=0).T
    a.qkv_t = mx.concatenate([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], axis=0).T
    mx.eval(m.gate_up_t, a.qkv_t)

VARIANTS = {
    "released (compiled SwiGLU)": (released_mlp, released_attn),
    "SwiGLU as 3 kernels": (plain_mlp, released_attn),
    "gate+up one matmul": (fused_mlp, released_attn),
    "gate+up and q,k,v one matmul each": (fused_mlp, fused_attn),
}


def run(variant):
    llama.MLP.__call__, llama.Attention.__call__ = VARIANTS[variant]
    ids = []
    t = None
    for i, (token, _) in enumerate(generate_step(prompt, model, max_tokens=n + 1)):
        if i == 0:
            t = time.perf_counter()  # from the first token: decode only
        ids.append(int(token))
    return n / (time.perf_counter() - t), ids


for v in VARIANTS:
    run(v)  # warm-up: kernels compile
rates = {v: [] for v in VARIANTS}
tokens = {}
for _ in range(rounds):
    for v in VARIANTS:
        r, ids = run(v)
        rates[v].append(r)
        tokens[v] = ids
base = statistics.median(rates[next(iter(VARIANTS))])
for v in VARIANTS:
    med = statistics.median(rates[v])
    same = tokens[v] == tokens[next(iter(VARIANTS))]
    print(f"{v:36s} {med:7.1f} tok/s  x{med / base:.3f}  same tokens: {same}  {[round(r) for r in rates[v]]}")
