"""What a constraint costs on the GPU: the worker decodes the same prompt with and without a
JSON schema, alternating within each round, as `cargo xtask bench --constrained` does on the
CPU (xtask/src/bench_constrained.rs): the schema's long `story` string keeps both sides decoding
the whole budget. llguidance computes each step's mask on the host while the forward pass runs;
on a GPU a step is short, so this is where the mask's cost would show.

Usage: python3 constrained.py --worker BIN --model DIR [--runs 5] [--max-new-tokens 256] [--out DIR]
"""

import argparse
import os
import statistics

from bench import Worker, prompts

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "story": {"type": "string", "minLength": 2000},
    },
    "required": ["title", "story"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA, "strict": True}}


def run(worker, messages, max_new, constrained):
    worker.call("reset", {})
    params = {"messages": messages, "max_new_tokens": max_new, "temperature": 0.0}
    if constrained == "regex":
        params["regex"] = "(.|\n)*"  # every token allowed: what masking itself costs
    elif constrained:
        params["response_format"] = FORMAT
    t = worker.call("generate", params)["timings"]
    return {"decode_tps": t["predicted_per_second"], "ttft_ms": t["ttft_ms"], "generated": t["predicted_n"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    worker = Worker(a.worker, a.model, os.path.join(a.out, "worker-stderr.log"))
    print("worker initialize:", worker.init.get("mlx"), flush=True)
    messages = next(p for p in prompts() if p["name"] == "short")["messages"]
    for constrained in (False, True):  # warm-up: kernels compile on first use
        run(worker, messages, 8, constrained)
    free, json_, any_ = [], [], []
    for i in range(a.runs):
        free.append(run(worker, messages, a.max_new_tokens, False))
        json_.append(run(worker, messages, a.max_new_tokens, True))
        any_.append(run(worker, messages, a.max_new_tokens, "regex"))
        print(f"round {i + 1}: free {free[-1]}, schema {json_[-1]}, any-text regex {any_[-1]}", flush=True)
    print("any-text regex decode tok/s median:", statistics.median(s["decode_tps"] for s in any_))
    worker.close()
    print(f"\n{a.model}, prompt `short`, greedy, {a.max_new_tokens} new tokens, median of {a.runs} runs; "
          "ratio = schema / free for tok/s, free / schema for ms")
    print("| metric | free text | JSON schema | ratio |\n|---|---|---|---|")
    for name, key, higher in (("decode tok/s", "decode_tps", True), ("ttft ms", "ttft_ms", False),
                              ("generated tokens", "generated", True)):
        f = statistics.median(s[key] for s in free)
        j = statistics.median(s[key] for s in json_)
        print(f"| {name} | {f:.1f} | {j:.1f} | {(j / f if higher else f / j):.2f}x |")


if __name__ == "__main__":
    main()
