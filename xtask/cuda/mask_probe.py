"""Probe: what applying a host-built vocabulary mask each step costs MLX's CUDA backend, in
mlx-lm's own pipelined decode loop (generate_step with a logits processor)."""
import sys, time
import numpy as np
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

model, tok = load(sys.argv[1])
prompt = mx.array(tok.encode("Tell me a long story about a fox."))
V = model(prompt[None])[0, -1].shape[-1]
print("vocab", V)

def rate(proc, n=256):
    list(generate_step(prompt, model, max_tokens=8, logits_processors=proc))
    t = time.perf_counter()
    for _ in generate_step(prompt, model, max_tokens=n, logits_processors=proc):
        pass
    return n / (time.perf_counter() - t)

neg = mx.array(-float("inf"))
ids = mx.arange(V, dtype=mx.uint32)
word, place = ids // 32, mx.array(1, dtype=mx.uint32) << (ids % 32)
mx.eval(word, place)
nw = (V + 31) // 32
def expand(words):
    return ((mx.take(words, word) // place) % 2).astype(mx.bool_)
def fresh_bits(tokens, logits):
    w = np.full(nw, 0xFFFFFFFF, dtype=np.uint32); w[0] = 0xFFFFFFFE
    return mx.where(expand(mx.array(w)), logits, neg)
resident = mx.array(np.full(nw, 0xFFFFFFFF, dtype=np.uint32)); mx.eval(resident)
def resident_bits(tokens, logits):
    return mx.where(expand(resident), logits, neg)
const = mx.array(np.ones(V, dtype=np.bool_)); mx.eval(const)
def tiny_upload(tokens, logits):
    return mx.where(const, logits, mx.array(np.array([-np.inf], dtype=np.float32)))
def fresh_bool(tokens, logits):
    m = np.ones(V, dtype=np.bool_); m[5] = False
    return mx.where(mx.array(m), logits, neg)
for name, proc in [("none", None), ("fresh bits", [fresh_bits]), ("resident bits", [resident_bits]),
                   ("tiny upload", [tiny_upload]), ("fresh bool", [fresh_bool]), ("none again", None)]:
    rs = sorted(rate(proc) for _ in range(5))
    print(f"{name}: {rs[2]:.1f} tok/s (runs {', '.join(f'{r:.0f}' for r in rs)})", flush=True)
