"""Continuous batching on MLX's CUDA backend: aggregate decode throughput at several widths,
mlx-worker (`--max-batch`) beside mlx-lm's `batch_generate` (its BatchGenerator), same GPU, same
libmlx, same model; and whether each batched answer is the one the worker gives alone.

Per width W (W different prompts, greedy, `--max-new-tokens` each): the worker gets the W
`generate` requests written at once and is timed until the last response; mlx-lm's
`batch_generate` gets the W prompts (chat template applied as the worker does). Aggregate tok/s =
generated tokens of all streams / wall time. One untimed warm-up per side and width (CUDA kernels
compile on first use); medians over `--runs`.

Each `--attention` mode (the worker's `--batch-attention`: `padded`, `rows`) is its own worker
process, both resident, run in turn with mlx-lm in every round.

Usage: python3 batch.py --worker BIN --model DIR [--widths 1,2,4,8] [--runs 3]
       [--max-new-tokens 128] [--attention padded,rows] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import time

PROMPTS = [
    "Write a long story about a dragon who learns to cook.",
    "Explain how a steam engine works, step by step.",
    "Describe the history of Rome from its founding to its fall.",
    "Write a poem about the ocean at night.",
    "Tell me about each planet of the solar system.",
    "How does a computer run a program?",
    "Give me a detailed recipe for sourdough bread.",
    "Describe a long walk through an autumn forest.",
]


class Worker:
    def __init__(self, binary, model, max_batch, attention, stderr_path):
        env = dict(os.environ, MLX_WORKER_LOG=os.environ.get("MLX_WORKER_LOG", "warn"))
        self.stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen(
            [binary, "--max-batch", str(max_batch), "--batch-attention", attention], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, env=env, text=True, bufsize=1,
        )
        self.next_id = 1
        self.init = self.call("initialize", {})
        self.call("load", {"model": model})

    def send(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        return rid

    def wait(self, ids):
        """Responses of `ids` (deltas skipped), by id."""
        out = {}
        while len(out) < len(ids):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited (rc {self.proc.poll()})")
            msg = json.loads(line)
            if msg.get("id") in ids:
                if "error" in msg:
                    raise RuntimeError(str(msg["error"]))
                out[msg["id"]] = msg["result"]
        return out

    def call(self, method, params):
        rid = self.send(method, params)
        return self.wait({rid})[rid]

    def run(self, prompts, max_new):
        """The results of `prompts` sent at once, and the wall time to the last response."""
        self.call("reset", {})
        t = time.perf_counter()
        ids = [self.send("generate", {"messages": [{"role": "user", "content": p}], "max_new_tokens": max_new,
                                      "temperature": 0.0}) for p in prompts]
        results = self.wait(set(ids))
        return [results[i] for i in ids], time.perf_counter() - t

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--attention", default="padded,rows")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    n = args.max_new_tokens

    import mlx.core as mx
    from mlx_lm import batch_generate, load

    modes = args.attention.split(",")
    workers = {m: Worker(args.worker, args.model, max(widths), m,
                         os.path.join(args.out, f"batch-worker-{m}.stderr")) for m in modes}
    init = workers[modes[0]].init
    print("worker:", init["mlx"]["backend"], init["mlx"]["device"]["name"],
          "max_batch", init["capabilities"]["max_batch"], "attention", modes, flush=True)
    alone = [workers[modes[0]].run([p], n)[0][0]["text"] for p in PROMPTS[: max(widths)]]

    model, tokenizer = load(args.model)
    def template(p):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: BatchEncoding

    encoded = [template(p) for p in PROMPTS]

    rows = []
    for w in widths:
        prompts = PROMPTS[:w]
        for worker in workers.values():
            worker.run(prompts, n)
        batch_generate(model, tokenizer, encoded[:w], max_tokens=n)
        mx.synchronize()
        wk = {m: [] for m in modes}
        same = {m: True for m in modes}
        ml = []
        for _ in range(args.runs):
            for m, worker in workers.items():
                results, dt = worker.run(prompts, n)
                wk[m].append(sum(r["usage"]["completion_tokens"] for r in results) / dt)
                same[m] = same[m] and [r["text"] for r in results] == alone[:w]
            t = time.perf_counter()
            out = batch_generate(model, tokenizer, encoded[:w], max_tokens=n, return_token_ids=True)
            mx.synchronize()
            dt = time.perf_counter() - t
            ml.append(sum(len(ids) for ids in out.token_ids) / dt)
        row = {"width": w, "mlx_lm_tps": statistics.median(ml)}
        for m in modes:
            row[f"worker_{m}_tps"] = statistics.median(wk[m])
            row[f"same_as_alone_{m}"] = same[m]
        rows.append(row)
        print(json.dumps(row), flush=True)
    for worker in workers.values():
        worker.close()
    for m in modes:
        base = rows[0][f"worker_{m}_tps"]
        print(f"\nworker --batch-attention {m}")
        print("| streams | worker tok/s | mlx-lm tok/s | worker / mlx-lm | worker / 1 stream | same as alone |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            t = r[f"worker_{m}_tps"]
            print(f"| {r['width']} | {t:.1f} | {r['mlx_lm_tps']:.1f} | {t / r['mlx_lm_tps']:.2f}x | "
                  f"{t / base:.2f}x | {r[f'same_as_alone_{m}']} |")
    with open(os.path.join(args.out, "batch.json"), "w") as f:
        json.dump({"max_new_tokens": n, "runs": args.runs, "attention": modes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
