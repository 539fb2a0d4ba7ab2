"""Greedy reference tokens from mlx-vlm, for `cargo xtask parity`'s vision models.

Usage: python vision_reference.py < REQUESTS > RESULTS (one JSON request per line, one result
line each, as reference.py).

Request: {"model_dir": str, "max_new_tokens": int,
          "cases": [{"name": str, "messages": [...]}]}
Messages are chat messages whose content may list `{"type": "image", "image": PATH}` parts.
Result:  {"cases": [{"name": str, "prompt_ids": [int], "tokens": [int]}]}

As the seed (Studio's MLX backend) drives mlx-vlm: the processor's tokenizer renders its chat
template over the messages (image parts in the host's order), mlx-vlm's `prepare_inputs` runs
the Hugging Face processor (pixel values, image tokens expanded) and tokenizes; greedy tokens
come from mlx-vlm's `generate_step`, stopping before the first EOS token.

Where mlx-vlm 0.7.0 cannot run with transformers 5.24, the least is patched: its LlavaProcessor
passes `padding` on to the image processor, which refuses it; the image processor here drops
such text-only arguments (see `image_processor_ignoring_text_kwargs`).

One deliberate difference: tokenization there adds the tokenizer's `<bos>` in front of the one
the template wrote (Gemma 3: mlx-vlm's processor has no chat template of its own, so
`should_add_special_tokens` says yes). The worker renders one `<bos>`, as mlx-lm and the text
engine do, so the duplicate is dropped here and both sides generate from the same prompt.
"""

import gc
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


# Text-only keyword arguments that transformers 5's image processors refuse (they validate their
# kwargs). mlx-vlm 0.7.0's own LlavaProcessor hands the image processor every kwarg it gets,
# `padding` from `prepare_inputs` among them, so with transformers 5.24 any LLaVA image input
# fails there ("ImagesKwargs.__init__() got an unexpected keyword argument 'padding'").
TEXT_ONLY_KWARGS = ("padding", "padding_side", "add_special_tokens")


def image_processor_ignoring_text_kwargs(processor):
    """Makes `processor.image_processor` drop TEXT_ONLY_KWARGS (a subclass, so its type checks
    still hold). Processors that route kwargs themselves (Gemma 3) never pass them: no change."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return
    base = type(image_processor)

    def call(self, images, *args, **kwargs):
        for k in TEXT_ONLY_KWARGS:
            kwargs.pop(k, None)
        return base.__call__(self, images, *args, **kwargs)

    image_processor.__class__ = type(base.__name__, (base,), {"__call__": call})


def main():
    for line in sys.stdin:
        if line.strip():
            answer(json.loads(line))


def answer(request):
    model, processor = load(request["model_dir"])
    image_processor_ignoring_text_kwargs(processor)
    tokenizer = getattr(processor, "tokenizer", processor)
    # An int where generation_config.json gives one (as llava-hf's does), else a list.
    eos = model.config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    eos |= {tokenizer.eos_token_id}
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
        # Qwen-VL: the image grids, for the tower and the M-RoPE positions.
        # Mistral 3: the images' sizes before padding, for the tower and the patch merger.
        extra = {k: inputs[k] for k in ("image_grid_thw", "image_sizes") if inputs.get(k) is not None}
        steps = generate_step(
            mx.array([ids]),
            model,
            inputs.get("pixel_values"),
            mx.ones((1, len(ids)), dtype=mx.int32),
            max_tokens=request["max_new_tokens"],
            temperature=0.0,
            prefill_step_size=PREFILL_STEP,
            **extra,
        )
        for token, _ in steps:
            if token in eos:
                break
            tokens.append(int(token))
        results.append({"name": case["name"], "prompt_ids": ids, "tokens": tokens})
    print(json.dumps({"blas": blas_libraries(), "cases": results}), flush=True)
    # The next request's model must not share memory with this one's.
    del model, processor, tokenizer
    gc.collect()
    mx.clear_cache()


if __name__ == "__main__":
    main()
