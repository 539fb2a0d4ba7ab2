"""Greedy reference tokens from mlx-vlm, for `cargo xtask parity`'s vision models.

Usage: python vision_reference.py < REQUEST_JSON > RESULT_JSON

Request: {"model_dir": str, "max_new_tokens": int,
          "cases": [{"name": str, "messages": [...]}]}
Messages are chat messages whose content may list `{"type": "image", "image": PATH}` parts.
Result:  {"cases": [{"name": str, "prompt_ids": [int], "tokens": [int]}]}

As the seed (Studio's MLX backend) drives mlx-vlm: the processor's tokenizer renders its chat
template over the messages (image parts in the host's order), mlx-vlm's `prepare_inputs` runs
the Hugging Face processor (pixel values, image tokens expanded) and tokenizes; greedy tokens
come from mlx-vlm's `generate_step`, stopping before the first EOS token.

One deliberate difference: tokenization there adds the tokenizer's `<bos>` in front of the one
the template wrote (Gemma 3: mlx-vlm's processor has no chat template of its own, so
`should_add_special_tokens` says yes). The worker renders one `<bos>`, as mlx-lm and the text
engine do, so the duplicate is dropped here and both sides generate from the same prompt.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_vlm import load
from mlx_vlm.generate.ar import generate_step
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from mlx_lm_bench import blas_libraries  # noqa: E402

# The worker's CPU prefill chunk (crates/engine/src/generate.rs PREFILL_CHUNK_CPU).
PREFILL_STEP = 512


def images_of(messages):
    return [
        part["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image"
    ]


def template_messages(messages):
    """The messages as the template sees them: image parts without their data (the seed's)."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]
        out.append(m)
    return out


def main():
    request = json.load(sys.stdin)
    model, processor = load(request["model_dir"])
    tokenizer = getattr(processor, "tokenizer", processor)
    eos = set(model.config.eos_token_id or []) | {tokenizer.eos_token_id}
    results = []
    for case in request["cases"]:
        images = images_of(case["messages"])
        prompt = tokenizer.apply_chat_template(
            template_messages(case["messages"]), tokenize=False, add_generation_prompt=True
        )
        inputs = prepare_inputs(
            processor,
            images=images or None,
            prompts=prompt,
            add_special_tokens=should_add_special_tokens(model.config.model_type, processor),
        )
        ids = [int(i) for i in inputs["input_ids"].flatten().tolist()]
        if len(ids) > 1 and ids[0] == ids[1] == tokenizer.bos_token_id:
            ids = ids[1:]
        tokens = []
        steps = generate_step(
            mx.array([ids]),
            model,
            inputs.get("pixel_values"),
            mx.ones((1, len(ids)), dtype=mx.int32),
            max_tokens=request["max_new_tokens"],
            temperature=0.0,
            prefill_step_size=PREFILL_STEP,
        )
        for token, _ in steps:
            if token in eos:
                break
            tokens.append(int(token))
        results.append({"name": case["name"], "prompt_ids": ids, "tokens": tokens})
    json.dump({"blas": blas_libraries(), "cases": results}, sys.stdout)


if __name__ == "__main__":
    main()
