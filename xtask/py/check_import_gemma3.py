"""Checks the imported Gemma 3 270M directory with the reference stack (transformers + mlx-lm).

usage: python check_import_gemma3.py MODEL_DIR GGUF_FILE
Run by `cargo xtask check-import`; exits non-zero on the first failed check.

1. Tokenizer: our tokenizer.json (through transformers' AutoTokenizer, as mlx-lm loads it) gives
   the same ids as transformers' own GGUF tokenizer builder run on the GGUF file, an independent
   reading of the same metadata, for a varied set of texts; decoding gives the text back.
2. Model: mlx-lm loads the directory; the mean negative log-likelihood of a known English
   paragraph is low (a wrong norm convention or q/k layout gives 7 to 19 nats, see
   docs/decisions/gguf-norm-shift.md),
   and greedy continuations name Paris.
"""

import sys
import types

import transformers  # noqa: F401  (imported before the stub below: it probes for a real torch)


class _NoTorch(types.ModuleType):
    """transformers' GGUF reader imports torch for tensor dtypes only; the tokenizer path reads
    metadata and never touches a tensor, and the reference venv has no torch."""

    def __getattr__(self, name):
        return type(name, (), {})


sys.modules.setdefault("torch", _NoTorch("torch"))

from transformers import AutoTokenizer  # noqa: E402
from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # noqa: E402
    convert_gguf_tokenizer,
    get_gguf_tokenizer,
)

TEXTS = [
    "The capital of France is",
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b\n\n\nclass Foo:\n\tpass\n",
    "x = [1,2,3]  # two spaces\n        eight spaces then\ttab\t\ttabs",
    "a  b   c    d" + " " * 40 + "e",
    "   leading spaces and trailing   ",
    "\n\n\nnewlines\r\n\r\nwindows",
    "3.14159 2718281828 1,000,000 12345 0x1F 1e-6",
    "Le café est très bon à Paris. Où est la bibliothèque ?",
    "Größere Straßen führen über die Brücke.",
    "日本語のテキストを分割します。東京は日本の首都です。",
    "emoji: 😀🎉👍🏽 👨\u200d👩\u200d👧 ❤️",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad> literal special tokens <unk>",
    "<table><tr><td>cell</td></tr></table> <b>bold</b>",
    "rare bytes: \u0001\u0002\u0007\u001b[0m \ufeff \u2028 \U0001F9FF \U000E0041",
    "Ünïcödé ñ ç ø å ß œ æ ¿¡",
    "Привет, мир! Это тест.",
    "السلام عليكم",
    "한국어 텍스트",
    " ",
    "",
]
# "▁" in the input is SentencePiece's own space mark: it encodes like a space, so it cannot
# decode back to itself (the reference does the same); ids are still compared.
NO_ROUND_TRIP = ["a literal ▁ metaspace and ▁▁ two"]

PARAGRAPH = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
    'from 1887 to 1889. Locally nicknamed "La dame de fer" (French for "Iron Lady"), it was '
    "constructed as the centerpiece of the 1889 World's Fair."
)
PARIS_PROMPTS = [
    "Q: What is the capital of France?\nA:",
    "The Eiffel Tower is located in the city of",
]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


def check_tokenizer(model_dir, gguf_file):
    arch, tok_dict, _ = get_gguf_tokenizer(gguf_file)
    reference, _ = convert_gguf_tokenizer(arch, tok_dict)
    ours = AutoTokenizer.from_pretrained(model_dir)
    byte_fallback = 0
    for text in TEXTS + NO_ROUND_TRIP:
        ids = ours(text, add_special_tokens=False)["input_ids"]
        ref = reference.encode(text, add_special_tokens=False).ids
        if ids != ref:
            print(f"  ours {ids}\n  ref  {ref}")
        check(ids == ref, f"same ids as the reference ({len(ids)} tokens): {text[:40]!r}")
        if text not in NO_ROUND_TRIP:
            back = ours.decode(ids)
            check(back == text, f"decodes back: {back[:40]!r}")
        byte_fallback += sum(tok.startswith("<0x") for tok in ours.convert_ids_to_tokens(ids))
    check(byte_fallback > 0, f"byte-fallback pieces were exercised ({byte_fallback})")
    with_bos = ours("Hello")["input_ids"]
    check(with_bos[0] == ours.bos_token_id == 2 and with_bos.count(2) == 1, f"<bos> added once: {with_bos}")
    turn = ours("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False)["input_ids"]
    check(turn[0] == 105 and turn[-1] == 106, f"<start_of_turn>=105 and <end_of_turn>=106 stay whole: {turn}")
    return ours


def check_model(model_dir):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm import generate, load
    from mlx_lm.sample_utils import make_sampler

    model, tok = load(model_dir)
    ids = mx.array([tok.encode(PARAGRAPH)])
    logits = model(ids[:, :-1]).astype(mx.float32)
    nll = nn.losses.cross_entropy(logits, ids[:, 1:]).mean().item()
    check(nll < 3.0, f"mean NLL of a known paragraph is {nll:.3f} nats/token (< 3)")
    for prompt in ["The capital of France is"] + PARIS_PROMPTS:
        text = generate(model, tok, prompt, max_tokens=16, sampler=make_sampler(temp=0.0))
        print(f"greedy: {prompt!r} -> {text!r}")
        if prompt in PARIS_PROMPTS:
            check("Paris" in text, "the continuation names Paris")


def main(model_dir, gguf_file):
    check_tokenizer(model_dir, gguf_file)
    check_model(model_dir)
    print("check-import gemma3: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
