"""Checks an imported model directory with the reference stack (transformers + mlx-lm).

usage: python check_import.py MODEL_DIR GGUF_CHAT_TEMPLATE_FILE
Run by `cargo xtask check-import`; exits non-zero on the first failed check.
"""

import sys

import jinja2
from mlx_lm import generate, load
from mlx_lm.sample_utils import make_sampler
from transformers import AutoTokenizer

QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]
# SmolLM2's ChatML, with the default system prompt its template adds (see shared/models.md).
EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
)


def ids_of(encoded):
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True).
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


def main(model_dir, template_file):
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    check(text == EXPECTED_PROMPT, f"transformers renders the ChatML prompt: {text!r}")

    gguf_template = open(template_file, encoding="utf-8").read()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    gguf_text = env.from_string(gguf_template).render(messages=MESSAGES, add_generation_prompt=True)
    check(gguf_text == text, "the GGUF's own chat template renders the same text")

    ids = ids_of(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    check(ids == tok(gguf_text, add_special_tokens=False)["input_ids"],
          "apply_chat_template ids == encoding of the GGUF-template text")
    check(ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2,
          f"<|im_start|>=1 opens the prompt, 3 turns, 2 <|im_end|>=2: {ids}")
    check(tok.decode(ids) == text, "decoding the ids gives the prompt back")
    digits = tok("12345", add_special_tokens=False)["input_ids"]
    check([tok.decode([i]) for i in digits] == list("12345"), f"digits split one per token: {digits}")

    model, mlx_tok = load(model_dir)
    prompt = mlx_tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    check(ids_of(prompt) == ids, "mlx-lm's tokenizer wrapper gives the same prompt ids")
    answer = generate(model, mlx_tok, prompt, max_tokens=24, sampler=make_sampler(temp=0.0))
    print(f"greedy answer: {answer!r}")
    check("Paris" in answer, "mlx-lm greedy answer names Paris")
    print("check-import: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
