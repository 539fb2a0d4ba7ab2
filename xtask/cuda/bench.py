"""mlx-worker vs mlx-lm on MLX's CUDA backend, same GPU, same libmlx, same model.

The worker is driven as `cargo xtask bench` drives it (xtask/src/bench.rs): newline-delimited
JSON-RPC over its stdin/stdout, `initialize`, `load` once, then one greedy `generate` per run, speeds
from `result.timings`, peak from `status.memory.peak_bytes`. mlx-lm runs in this process with the
model loaded once, measured as xtask/bench/mlx_lm_bench.py measures it (`stream_generate`'s
`prompt_tps` / `generation_tps`). One untimed warm-up per prompt and side (MLX's CUDA backend
compiles kernels on first use), then per round and prompt: worker, then mlx-lm. Medians.
The greedy texts of the two sides are compared as a correctness smoke test.

Usage: python3 bench.py --worker BIN --model DIR [--runs 7] [--max-new-tokens 256] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Worker:
    def __init__(self, binary, model, stderr_path):
        env = dict(os.environ, MLX_WORKER_LOG=os.environ.get("MLX_WORKER_LOG", "warn"))
        self.stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen(
            [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
            text=True, bufsize=1,
        )
        self.next_id = 1
        self.init = self.call("initialize", {"client": {"name": "cuda-bench", "version": "0"}})
        t = time.perf_counter()
        self.load = self.call("load", {"model": model})
        self.load_s = time.perf_counter() - t

    def call(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited (rc {self.proc.poll()}) during {method}")
            msg = json.loads(line)
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def generate(self, messages, max_new):
        # As xtask/src/bench.rs: every run starts from an empty prompt cache (builds from b1a57dc
        # on keep the last prompt's KV cache and would prefill only the new suffix).
        self.call("reset", {})
        r = self.call("generate", {"messages": messages, "max_new_tokens": max_new, "temperature": 0.0})
        st = self.call("status", {})
        t = r["timings"]
        return {
            "prompt_tokens": t["prompt_n"], "generated": t["predicted_n"],
            "prompt_tps": t["prompt_per_second"], "decode_tps": t["predicted_per_second"],
            "ttft_ms": t["ttft_ms"], "peak_mb": st["memory"]["peak_bytes"] / 1e6,
            "text": r["text"], "finish": r["finish_reason"],
            "cached_tokens": r["usage"].get("cached_tokens", 0),
        }

    def close(self):
        try:
            self.call("shutdown", {})
        except Exception as e:  # noqa: BLE001
            print("shutdown:", e)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class MlxLm:
    def __init__(self, model):
        from mlx_lm import load
        t = time.perf_counter()
        self.model, self.tokenizer = load(model)
        self.load_s = time.perf_counter() - t

    def generate(self, messages, max_new):
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler
        start = time.perf_counter()
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ttft, last, text = None, None, ""
        for r in stream_generate(self.model, self.tokenizer, list(ids), max_tokens=max_new,
                                 sampler=make_sampler(temp=0.0)):
            if ttft is None:
                ttft = time.perf_counter() - start
            text += r.text
            last = r
        return {
            "prompt_tokens": last.prompt_tokens, "generated": last.generation_tokens,
            "prompt_tps": last.prompt_tps, "decode_tps": last.generation_tps,
            "ttft_ms": ttft * 1000.0, "peak_mb": last.peak_memory * 1e3,
            "text": text, "finish": last.finish_reason,
        }


def prompts():
    with open(os.path.join(HERE, "..", "bench", "prompts.json")) as fh:
        ps = json.load(fh)["prompts"]
    long = next(p for p in ps if p["name"] == "long")["messages"][0]["content"]
    # ~2k tokens: four prefill chunks for the worker (512), one for mlx-lm (2048).
    ps.append({"name": "long4x", "messages": [{"role": "user", "content": "\n\n".join([long] * 4)}]})
    return ps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default=".")
    ap.add_argument("--sides", default="worker,mlx-lm")
    ap.add_argument("--prompts", default="short,long,long4x")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sides = a.sides.split(",")
    impl = {}
    if "worker" in sides:
        impl["worker"] = Worker(a.worker, a.model, os.path.join(a.out, "worker-stderr.log"))
        print("worker initialize:", json.dumps(impl["worker"].init.get("mlx", impl["worker"].init)), flush=True)
        print(f"worker load: {impl['worker'].load_s:.2f} s", flush=True)
    if "mlx-lm" in sides:
        import mlx.core as mx
        impl["mlx-lm"] = MlxLm(a.model)
        print(f"mlx-lm: mlx {mx.__version__}, {mx.default_device()}, load {impl['mlx-lm'].load_s:.2f} s", flush=True)
    ps = [p for p in prompts() if p["name"] in a.prompts.split(",")]
    samples = {p["name"]: {s: [] for s in sides} for p in ps}
    texts = {}
    for p in ps:  # warm-up (kernel compilation), also the texts compared below
        for s in sides:
            t = time.perf_counter()
            r = impl[s].generate(p["messages"], a.max_new_tokens)
            texts[(p["name"], s)] = r
            print(f"warm-up {p['name']:7s} {s:7s} {time.perf_counter() - t:6.2f} s  prompt {r['prompt_tokens']} "
                  f"gen {r['generated']} prefill {r['prompt_tps']:.0f} decode {r['decode_tps']:.1f}", flush=True)
    for i in range(a.runs):
        for p in ps:
            for s in sides:
                r = impl[s].generate(p["messages"], a.max_new_tokens)
                samples[p["name"]][s].append({k: v for k, v in r.items() if k != "text"})
                if r["text"] != texts[(p["name"], s)]["text"]:
                    print(f"NOTE: {s} {p['name']} run {i}: greedy text differs from its warm-up", flush=True)
        print(f"round {i + 1}/{a.runs} done", flush=True)
    if "worker" in impl:
        impl["worker"].close()

    report = {"device": None, "runs": a.runs, "max_new_tokens": a.max_new_tokens, "prompts": {}}
    try:
        import mlx.core as mx
        report["device"] = mx.device_info() if hasattr(mx, "device_info") else str(mx.default_device())
    except Exception as e:  # noqa: BLE001
        report["device"] = repr(e)
    lines = []
    for p in ps:
        name = p["name"]
        med = {s: {k: statistics.median(x[k] for x in samples[name][s])
                   for k in ("prompt_tps", "decode_tps", "ttft_ms", "peak_mb")} for s in sides}
        entry = {"median": med, "samples": samples[name]}
        ptoks = {s: samples[name][s][0]["prompt_tokens"] for s in sides}
        gens = {s: sorted({x["generated"] for x in samples[name][s]}) for s in sides}
        lines.append(f"\n{name}: prompt tokens {ptoks}, generated {gens}")
        if len(sides) == 2:
            w, m = med["worker"], med["mlx-lm"]
            lines.append("| metric | worker | mlx-lm | ratio (worker advantage) |")
            lines.append("|---|---|---|---|")
            for k, label, higher in (("prompt_tps", "prefill tok/s", True), ("decode_tps", "decode tok/s", True),
                                     ("ttft_ms", "ttft ms", False), ("peak_mb", "peak memory MB", False)):
                ratio = w[k] / m[k] if higher else m[k] / w[k]
                lines.append(f"| {label} | {w[k]:.1f} | {m[k]:.1f} | {ratio:.2f}x |")
            tw, tm = texts[(name, "worker")]["text"], texts[(name, "mlx-lm")]["text"]
            same = 0
            while same < min(len(tw), len(tm)) and tw[same] == tm[same]:
                same += 1
            entry["text_equal"] = tw == tm
            entry["common_prefix_chars"] = same
            entry["texts"] = {"worker": tw, "mlx-lm": tm}
            lines.append(f"greedy text equal: {tw == tm} (common prefix {same} of {len(tw)}/{len(tm)} chars); "
                         f"start: {tw[:80]!r}")
        report["prompts"][name] = entry
    with open(os.path.join(a.out, "bench.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(f"\ndevice: {report['device']}\nrandom Llama-3.2-1B shape, bf16, greedy, {a.max_new_tokens} new tokens, "
          f"median of {a.runs} runs after one warm-up", flush=True)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
