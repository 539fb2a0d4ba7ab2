"""mlx-vlm's side of `cargo xtask bench --vision`: one image and a question, greedy, as the seed
drives mlx-vlm (the processor's tokenizer renders the template, `prepare_inputs` runs the
Hugging Face processor, `generate_step` generates; the duplicate `<bos>` dropped as the parity
reference does, so both sides run the same prompt).

Usage: python mlx_vlm_bench.py MODEL_DIR IMAGE QUESTION MAX_NEW_TOKENS RUNS
Prints one JSON line: {"samples": [{"prompt_tokens", "generated", "ttft_ms", "decode_tps"}]}
(one warm-up run first, not reported). ttft counts from the request (image file in hand) to the
first token: loading and preprocessing the image, the encoder, prefill.
"""

import json
import sys
import time

import mlx.core as mx
from mlx_vlm import load
from mlx_vlm.generate.ar import generate_step
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens


def main():
    model_dir, image, question = sys.argv[1], sys.argv[2], sys.argv[3]
    max_new_tokens, runs = int(sys.argv[4]), int(sys.argv[5])
    model, processor = load(model_dir)
    tokenizer = getattr(processor, "tokenizer", processor)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    eos = set(model.config.eos_token_id or []) | {tokenizer.eos_token_id}
    samples = []
    for run in range(runs + 1):
        start = time.perf_counter()
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = prepare_inputs(
            processor,
            images=[image],
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
            max_tokens=max_new_tokens,
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
        if run == 0:
            continue
        samples.append({
            "prompt_tokens": len(ids),
            "generated": generated,
            "ttft_ms": (first - start) * 1000,
            "decode_tps": (generated - 1) / (end - first) if generated > 1 else 0.0,
        })
    print(json.dumps({"samples": samples}))


if __name__ == "__main__":
    main()
