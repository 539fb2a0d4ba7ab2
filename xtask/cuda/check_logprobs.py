"""Correctness smoke test that survives near-ties: teacher-forced log-probabilities.

Greedy texts of two implementations part at the first near-tie where their bfloat16 sums round
differently, so instead: take each side's greedy tokens (worker: `generate` with `logprobs`;
mlx-lm: `stream_generate`), run mlx-lm's model once over prompt + those tokens, and for every
step compare the chosen token with that forward pass's argmax. A correct decoder picks the argmax
or a token within a small log-probability gap of it; mlx-lm's own greedy tokens are the control.

Usage: python3 check_logprobs.py MODEL_DIR WORKER_BIN [MAX_NEW]
"""
import json, os, subprocess, sys
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

model_dir, worker = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 256
m, tok = load(model_dir)
msgs = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
if hasattr(ids, "keys"):
    ids = ids["input_ids"]
ids = list(ids)

p = subprocess.Popen([worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                     env=dict(os.environ, MLX_WORKER_LOG="warn"))
n = [0]
def call(method, params, notes=None):
    n[0] += 1
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": n[0], "method": method, "params": params}) + "\n")
    p.stdin.flush()
    while True:
        msg = json.loads(p.stdout.readline())
        if msg.get("id") == n[0]:
            if "error" in msg:
                raise RuntimeError(msg["error"])
            return msg["result"]
        if notes is not None and "method" in msg:
            notes.append(msg)
call("initialize", {"client": {"name": "check", "version": "0"}})
call("load", {"model": model_dir})
notes = []
call("generate", {"messages": msgs, "max_new_tokens": N, "temperature": 0.0, "logprobs": 1}, notes)
call("shutdown", {})
w_tokens, w_lp = [], []
for msg in notes:
    for t in (msg.get("params") or {}).get("tokens") or []:
        w_tokens.append(t["id"]); w_lp.append(t["logprob"])
l_tokens = [r.token for r in stream_generate(m, tok, ids, max_tokens=N, sampler=make_sampler(temp=0.0))]

def score(name, gen, reported=None):
    x = mx.array([ids + gen[:-1]])
    logits = m(x)[0, len(ids) - 1:].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    top = mx.argmax(lp, axis=-1)
    chosen = mx.take_along_axis(lp, mx.array(gen)[:, None], axis=-1)[:, 0]
    gap = mx.take_along_axis(lp, top[:, None], axis=-1)[:, 0] - chosen
    mx.eval(gap)
    gap, top = gap.tolist(), top.tolist()
    off = [i for i, (a, b) in enumerate(zip(gen, top)) if a != b]
    line = (f"{name}: {len(gen)} tokens, {len(off)} not the teacher-forced argmax "
            f"(max gap {max(gap):.4f} nats; first at step {off[0] if off else None})")
    if reported:
        d = max(abs(a - b) for a, b in zip(reported, chosen.tolist()))
        line += f"; |reported logprob - teacher-forced| max {d:.4f}"
    print(line, flush=True)

score("worker", w_tokens, w_lp)
score("mlx-lm", l_tokens)
first = next((i for i, (a, b) in enumerate(zip(w_tokens, l_tokens)) if a != b), None)
print(f"worker vs mlx-lm greedy tokens: first difference at step {first} of {min(len(w_tokens), len(l_tokens))}")
