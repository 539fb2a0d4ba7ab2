"""The mlx-lm side of `cargo xtask bench`: a long-lived process that measures one generation per
request, as the worker does (the model is loaded once, at start).

Usage: python mlx_lm_bench.py MODEL_DIR [DRAFT_MODEL_DIR]   (then one JSON request per line on stdin)

Request: {"messages": [...], "max_new_tokens": int, "num_draft_tokens": int (with a draft model)}
Answer (one JSON line on stdout): prompt and decode speed as `stream_generate` reports them
(`prompt_tps`, `generation_tps`), the time to the first token (chat template and tokenization
included, as the worker's `ttft_ms` includes them), MLX's peak memory since start (as
`stream_generate`'s `peak_memory`, and the worker's `status`, count it), and which BLAS the process
has mapped (to show whether an OpenBLAS preload took effect). The ready line also gives MLX's
active memory right after the load (the weights as held). With a draft model, answers also carry
the text and how many tokens the draft model proposed that were accepted (`from_draft`).
"""

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "parity"))
import mlx_compat  # noqa: E402

# mlx-lm 0.32.2's quantized MoE layers on MLX 0.32.2 (`bench --moe`; docs/decisions/moe.md).
mlx_compat.install()


def blas_libraries():
    """Shared BLAS libraries mapped into this process."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in path.lower():
                names.add(path.rsplit("/", 1)[-1])
    return sorted(names)


def run(model, tokenizer, request, draft_model):
    start = time.perf_counter()
    ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 may give a BatchEncoding
        ids = ids["input_ids"]
    ttft = None
    last = None
    text = ""
    from_draft = 0
    speculative = {}
    if draft_model is not None:
        speculative = {"draft_model": draft_model, "num_draft_tokens": request["num_draft_tokens"]}
    for response in stream_generate(
        model,
        tokenizer,
        list(ids),
        max_tokens=request["max_new_tokens"],
        sampler=make_sampler(temp=0.0),
        **speculative,
    ):
        if ttft is None:
            ttft = time.perf_counter() - start
        last = response
        text += response.text
        from_draft += int(bool(getattr(response, "from_draft", False)))
    return {
        "prompt_tokens": last.prompt_tokens,
        "prompt_tps": last.prompt_tps,
        "generation_tokens": last.generation_tokens,
        "generation_tps": last.generation_tps,
        "ttft_ms": ttft * 1000.0,
        "peak_memory_bytes": int(last.peak_memory * 1e9),
        "finish_reason": last.finish_reason,
        "blas": blas_libraries(),
        "text": text,
        "from_draft": from_draft,
    }


def main():
    model, tokenizer = load(sys.argv[1])
    draft_model = load(sys.argv[2])[0] if len(sys.argv) > 2 else None
    ready = {"ready": True, "blas": blas_libraries(), "active_memory_bytes": mx.get_active_memory()}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(model, tokenizer, json.loads(line), draft_model)), flush=True)


if __name__ == "__main__":
    main()
