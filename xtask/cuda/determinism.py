"""Run-to-run reproducibility of greedy decoding on MLX CUDA, mlx-lm side and worker side.
Usage: python3 determinism.py MODEL_DIR WORKER_BIN"""
import json, subprocess, sys, os
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.models.cache import make_prompt_cache

model_dir, worker = sys.argv[1], sys.argv[2]
m, tok = load(model_dir)
msgs = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
if hasattr(ids, "keys"):
    ids = ids["input_ids"]
N = 256

def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)

def stream():
    return [r.token for r in stream_generate(m, tok, list(ids), max_tokens=N, sampler=make_sampler(temp=0.0))]

def manual(sync_every):
    c = make_prompt_cache(m)
    y = mx.argmax(m(mx.array([ids]), cache=c)[:, -1], -1)
    out = []
    for _ in range(N):
        out.append(y.item())
        y = mx.argmax(m(y[None], cache=c)[:, -1], -1)
    return out

runs = {f"stream{i}": stream() for i in range(4)}
runs.update({f"manual{i}": manual(1) for i in range(2)})
for k, v in runs.items():
    print(f"{k}: first diff vs stream0 at token {first_diff(runs['stream0'], v)}, vs manual0 at {first_diff(runs['manual0'], v)}", flush=True)
base = runs["stream0"]

env = dict(os.environ, MLX_WORKER_LOG="warn")
p = subprocess.Popen([worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
n = [0]
def call(method, params):
    n[0] += 1
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": n[0], "method": method, "params": params}) + "\n"); p.stdin.flush()
    while True:
        msg = json.loads(p.stdout.readline())
        if msg.get("id") == n[0]:
            return msg.get("result", msg.get("error"))
call("initialize", {"client": {"name": "det", "version": "0"}})
call("load", {"model": model_dir})
wt = []
for i in range(4):
    r = call("generate", {"messages": msgs, "max_new_tokens": N, "temperature": 0.0})
    wt.append(r["text"])
ref = tok.decode(base)
for i, t in enumerate(wt):
    d = next((j for j, (x, y) in enumerate(zip(ref, t)) if x != y), None)
    print(f"worker{i}: vs worker0 first char diff at {next((j for j, (x, y) in enumerate(zip(wt[0], t)) if x != y), None)}", flush=True)
    print(f"worker{i}: first char diff vs stream0 text at {d} (len {len(t)} vs {len(ref)})", flush=True)
call("shutdown", {})
