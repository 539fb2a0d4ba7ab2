"""The mlx-lm side of `cargo xtask bench --batch`: a long-lived process that runs several chats at
once through mlx-lm's `BatchGenerator` (continuous batching: one batched forward pass per decode
step), the model loaded once, at start.

Usage: python mlx_lm_batch.py MODEL_DIR   (then one JSON request per line on stdin)

Request: {"prompts": [[message, ...], ...], "max_new_tokens": int}, one conversation per stream.
Each is templated as the worker templates it (`apply_chat_template` with the generation prompt),
then all are inserted into one `BatchGenerator` (greedy, the tokenizer's EOS ids as stop tokens,
every stream in one batch) and run until every stream has finished.
Answer (one JSON line on stdout): `wall_s`, from the request's arrival (before templating, as the
worker's clock starts before it templates) until the last stream finished; per stream, in request
order: `generated` (tokens, the EOS that ended a stream not counted, as the worker counts them),
`ttft_ms` (until its first generated token) and `prompt_tokens`. The ready line gives the BLAS
libraries the process has mapped (to show whether an OpenBLAS preload took effect).
"""

import json
import sys
import time
from pathlib import Path

from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlx_lm_bench import blas_libraries  # noqa: E402


def template(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 may give a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def run(model, tokenizer, request):
    n = len(request["prompts"])
    max_tokens = request["max_new_tokens"]
    start = time.perf_counter()
    prompts = [template(tokenizer, messages) for messages in request["prompts"]]
    generator = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        sampler=make_sampler(temp=0.0),
        completion_batch_size=max(n, 32),
        prefill_batch_size=max(n, 8),
    )
    uids = generator.insert(prompts, [max_tokens] * n)
    stream = {uid: i for i, uid in enumerate(uids)}
    generated = [0] * n
    ttft = [None] * n
    while responses := generator.next_generated():
        for r in responses:
            i = stream[r.uid]
            if ttft[i] is None:
                ttft[i] = (time.perf_counter() - start) * 1000.0
            if r.finish_reason != "stop":
                generated[i] += 1
    wall = time.perf_counter() - start
    generator.close()
    return {
        "wall_s": wall,
        "generated": generated,
        "ttft_ms": ttft,
        "prompt_tokens": [len(p) for p in prompts],
    }


def main():
    model, tokenizer = load(sys.argv[1])
    print(json.dumps({"ready": True, "blas": blas_libraries()}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(model, tokenizer, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
