"""The mlx-lm side of `cargo xtask bench --cache`: a long-lived process that prefills given token
ids from an empty cache (mlx-lm has no prompt cache across `stream_generate` calls, nor a disk
tier), as the worker's cold row does (the model is loaded once, at start).

Usage: python mlx_lm_prefill.py MODEL_DIR   (then one JSON request per line on stdin)

Request: {"tokens": [int, ...], "max_new_tokens": int} (the ids the worker's `tokenize` gave for
the templated conversation, so both sides run the same prompt).
Answer (one JSON line on stdout): `prompt_tokens` and `prompt_tps` as `stream_generate` reports
them, `prompt_ms` = prompt_tokens / prompt_tps (its prompt time: the prefill and the first
token), `ttft_ms` (wall time from the request read to the first token), `generation_tokens`,
and which BLAS the process has mapped (to show whether an OpenBLAS preload took effect). The ready
line also gives MLX's active memory right after the load.
"""

import json
import sys
import time

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

# The same process setup and BLAS report as `cargo xtask bench`'s side (this file's directory
# is on the path: Python puts the script's there).
from mlx_lm_bench import blas_libraries  # noqa: E402


def run(model, tokenizer, request):
    start = time.perf_counter()
    ttft = None
    last = None
    for response in stream_generate(
        model,
        tokenizer,
        list(request["tokens"]),
        max_tokens=request["max_new_tokens"],
        sampler=make_sampler(temp=0.0),
    ):
        if ttft is None:
            ttft = time.perf_counter() - start
        last = response
    return {
        "prompt_tokens": last.prompt_tokens,
        "prompt_tps": last.prompt_tps,
        "prompt_ms": last.prompt_tokens / last.prompt_tps * 1000.0,
        "ttft_ms": ttft * 1000.0,
        "generation_tokens": last.generation_tokens,
        "blas": blas_libraries(),
    }


def main():
    model, tokenizer = load(sys.argv[1])
    ready = {"ready": True, "blas": blas_libraries(), "active_memory_bytes": mx.get_active_memory()}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(model, tokenizer, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
