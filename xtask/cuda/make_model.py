"""A random model with Llama-3.2-1B's shape (16 layers, hidden 2048, FFN 8192, 32 heads, 8 KV heads,
head_dim 64, vocab 128256, tied embeddings, llama3 RoPE scaling), bfloat16, written with PyTorch in
the Hugging Face / mlx-lm tensor layout, with SmolLM2's tokenizer (ChatML template).

The tokenizer knows ids < 49152 only; the embedding rows past it, and those of SmolLM2's 17 special
tokens, are zero, so with the tied head their logits are 0 while the best real token's is large and
positive: greedy decoding never emits an unknown id or EOS, so every run generates its full budget.
Block matrices have std 2/sqrt(fan_in) (larger than a default init) so the greedy text varies.

Usage: python3 make_model.py OUT_DIR TOKENIZER_DIR [EMBED_STD (default 1.0)]

With EMBED_STD 1.0 the logits are large (std ~28, top values ~200, where bfloat16 steps by 1),
so near-ties flip greedy tokens on any change of summation order; 0.02 (a usual init) gives
logits of order 1.
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
TOKENIZER_VOCAB = 49152
SPECIAL_TOKENS = 17


def main():
    out, tok = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    c = CONFIG
    h, f, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)

    def mat(rows, cols, std):
        w = torch.randn(rows, cols, generator=g, device=dev, dtype=torch.float32) * std
        return w.to(torch.bfloat16).cpu().contiguous()

    emb = mat(c["vocab_size"], h, float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
    emb[TOKENIZER_VOCAB:] = 0
    emb[:SPECIAL_TOKENS] = 0
    t = {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = mat(q, h, 2 / h**0.5)
        t[p + "self_attn.k_proj.weight"] = mat(kv, h, 2 / h**0.5)
        t[p + "self_attn.v_proj.weight"] = mat(kv, h, 2 / h**0.5)
        t[p + "self_attn.o_proj.weight"] = mat(h, q, 2 / q**0.5)
        t[p + "mlp.gate_proj.weight"] = mat(f, h, 2 / h**0.5)
        t[p + "mlp.up_proj.weight"] = mat(f, h, 2 / h**0.5)
        t[p + "mlp.down_proj.weight"] = mat(h, f, 2 / f**0.5)
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(c, fh, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, fh)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, name), out)
    n = sum(v.numel() for v in t.values())
    print(f"wrote {out}: {n} parameters, {len(t)} tensors, bfloat16")


if __name__ == "__main__":
    main()
