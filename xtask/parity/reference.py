"""Greedy reference tokens from mlx-lm, for `cargo xtask parity`.

Usage: python reference.py < REQUESTS > RESULTS (one JSON request per line, one result line
each, in order: `cargo xtask parity` keeps one process for every model of a run).

Request: {"model_dir": str, "adapter_dir": str?, "kv_bits": int?, "chat_template": str?,
          "max_new_tokens": int,
          "cases": [{"name": str, "messages": [...]}]}
Result:  {"blas": [str], "cases": [{"name": str, "prompt_ids": [int], "tokens": [int]}]}
("blas": the BLAS libraries mapped into this process; xtask preloads the worker's.)

With "parallel": "tensor" (run as a group of ranks, as `cargo xtask parity --ranks N
--parallel tensor` starts it), mlx-lm's own tensor parallelism splits the model
(`sharded_load` with a tensor group over MLX's ring backend); rank 0 answers.

Prompt ids come from the Hugging Face tokenizer's chat template (as mlx-lm's server and
`mlx_lm.generate` build them); tokens are greedy (`make_sampler(temp=0.0)`) from
`generate_step`, stopping before the first EOS token as `stream_generate` does.
"""

import gc
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from mlx_lm_bench import blas_libraries  # noqa: E402
import mlx_compat  # noqa: E402

# mlx-lm 0.32.2's quantized MoE layers on MLX 0.32.2 (docs/decisions/moe.md).
mlx_compat.install()


def prompt_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 may answer with a BatchEncoding instead of a plain list.
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


# The worker prefills in chunks of 512 tokens on the CPU (crates/engine/src/generate.rs
# PREFILL_CHUNK_CPU; 2048 like mlx-lm on a GPU);
# chunk boundaries decide the caches' layout (a sliding-window layer's cache is trimmed per
# chunk), so the reference uses the same size.
PREFILL_STEP = 512


def greedy(model, tokenizer, ids, max_new_tokens, kv_bits=None):
    sampler = make_sampler(temp=0.0)
    tokens = []
    # kv_bits: the worker quantizes the KV cache from the first forward pass on.
    steps = generate_step(
        mx.array(ids),
        model,
        max_tokens=max_new_tokens,
        sampler=sampler,
        prefill_step_size=PREFILL_STEP,
        kv_bits=kv_bits,
        kv_group_size=64,
        quantized_kv_start=0,
    )
    for token, _ in steps:
        token = int(token)
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
    return tokens


def main():
    for line in sys.stdin:
        if line.strip():
            answer(json.loads(line))


def answer(request):
    group = None
    if request.get("parallel") == "tensor":
        from mlx_lm.utils import sharded_load

        group = mx.distributed.init(strict=True, backend="ring")
        model, tokenizer = sharded_load(request["model_dir"], tensor_group=group)
    else:
        model, tokenizer = load(request["model_dir"], adapter_path=request.get("adapter_dir"))
    if template := request.get("chat_template"):
        tokenizer._tokenizer.chat_template = template  # the Hugging Face tokenizer mlx-lm wraps
    results = []
    for case in request["cases"]:
        ids = prompt_ids(tokenizer, case["messages"])
        tokens = greedy(model, tokenizer, ids, request["max_new_tokens"], request.get("kv_bits"))
        results.append({"name": case["name"], "prompt_ids": ids, "tokens": tokens})
    if group is None or group.rank() == 0:
        print(json.dumps({"blas": blas_libraries(), "cases": results}), flush=True)
    # The next request's model must not share memory with this one's.
    del model, tokenizer
    gc.collect()
    mx.clear_cache()


if __name__ == "__main__":
    main()
