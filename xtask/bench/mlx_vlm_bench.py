"""mlx-vlm's side of `cargo xtask bench --vision`: a long-lived process that measures one
generation per request (the model is loaded once, at start), so that the bench can alternate
it with the worker round by round. Each request runs as the seed drives mlx-vlm: the processor's
tokenizer renders the template, `prepare_inputs` runs the Hugging Face processor,
`generate_step` generates; the duplicate `<bos>` is dropped as the parity reference does, so
both sides run the same prompt.

Usage: python mlx_vlm_bench.py MODEL_DIR   (then one JSON request per line on stdin)

Request: {"image": path, "question": str, "max_new_tokens": int}
Answer (one JSON line): {"prompt_tokens", "generated", "ttft_ms", "decode_tps"}. ttft counts
from the request (image file in hand) to the first token: loading and preprocessing the image,
the encoder, prefill. MLX's buffer cache is cleared after every request. The ready line gives
the BLAS libraries mapped (to show whether an OpenBLAS preload took effect) and MLX's active
memory after the load.
"""

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_vlm import load
from mlx_vlm.generate.ar import generate_step
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlx_lm_bench import blas_libraries  # noqa: E402


def run(model, processor, request):
    tokenizer = getattr(processor, "tokenizer", processor)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": request["question"]}]}]
    eos = set(model.config.eos_token_id or []) | {tokenizer.eos_token_id}
    start = time.perf_counter()
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = prepare_inputs(
        processor,
        images=[request["image"]],
        prompts=prompt,
        add_special_tokens=should_add_special_tokens(model.config.model_type, processor),
    )
    ids = inputs["input_ids"].flatten().tolist()
    if ids[0] == ids[1] == tokenizer.bos_token_id:
        ids = ids[1:]
    steps = generate_step(
        mx.array([ids]),
        model,
        inputs["pixel_values"],
        mx.ones((1, len(ids)), dtype=mx.int32),
        max_tokens=request["max_new_tokens"],
        temperature=0.0,
    )
    generated, first = 0, None
    for token, _ in steps:
        if first is None:
            first = time.perf_counter()
        if token in eos:
            break
        generated += 1
    end = time.perf_counter()
    mx.clear_cache()
    return {
        "prompt_tokens": len(ids),
        "generated": generated,
        "ttft_ms": (first - start) * 1000,
        "decode_tps": (generated - 1) / (end - first) if generated > 1 else 0.0,
    }


def main():
    model, processor = load(sys.argv[1])
    ready = {"ready": True, "blas": blas_libraries(), "active_memory_bytes": mx.get_active_memory()}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(model, processor, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
