"""A fixture as llama.cpp's converter would write it: one GGUF beside the checkpoint.

`write_gguf(config, weights, fixture_dir, spec)` writes `<fixture_dir>/<name>.gguf` with gguf-py
(llama.cpp's own Python library): the architecture's hyperparameters under its GGUF keys, the
tokenizer as `tokenizer.ggml.*` (byte-level BPE from the fixture's tokenizer.json; special token
ids, add-bos flag, merges and chat template through gguf-py's `SpecialVocab`), and every tensor
under the name gguf-py's tensor map gives it. Tensors are float32 unless the spec asks for a
quantized type (below), and then the checkpoint is rounded to the same values: either way the
imported checkpoint holds the fixture's exact values, and the worker on the `.gguf` must match
mlx-lm on the original checkpoint token for token (`cargo xtask parity`, fixtures with a "gguf"
spec).

What llama.cpp's converter (convert_hf_to_gguf.py) does besides renaming, and is done here:
- `llama` (and Mistral and Mixtral, which llama.cpp converts as `llama`): q/k rows regrouped so that rotary
  pairs are adjacent (its `LlamaModel.permute`); the other architectures use NeoX-style RoPE and
  keep the Hugging Face rows. Llama 3's RoPE scaling becomes a tensor of per-frequency factors,
  `rope_freqs.weight` (its `generate_extra_tensors`, in float32), and no metadata;
- `"experts": "MXFP4"` in the spec: expert weights stored as MXFP4 blocks (GPT-OSS's released
  format); `"matrices": "Q8_0"` (or another type gguf-py can quantize: Q4_0, Q4_1, Q5_0, Q5_1)
  for the other 2-D weights. The checkpoint's weights are first rounded to the values those
  blocks hold (`exact_in_gguf`), so checkpoint and GGUF are still the same model;
- K-quants (Q2_K..Q6_K), which gguf-py reads but cannot write: `"matrices"` may also be a
  list of types taken in turn, tensor by tensor (a llama.cpp "Q4_K_M" file mixes Q4_K and
  Q6_K). A K-quant tensor's blocks are drawn at random (seeded by its name, scales kept
  small and finite) and the checkpoint takes what gguf-py's dequantizer reads from them;
- LFM2: the short convolutions squeezed to `(channels, kernel)`, `attention.head_count_kv` a
  list with 0 for each convolution layer, `shortconv.l_cache`, the MLP width as LFM2 adjusts
  `block_ff_dim` (its `LFM2Model`);
- Qwen3-MoE, Mixtral (as `llama`), GPT-OSS: the experts stacked, one 3-D tensor per projection
  (`ffn_{gate,up,down}_exps`); GPT-OSS's sinks named `attn_sinks.weight`;
- GLM-4 MoE (`glm4moe`, its `Glm4MoeModel`): the experts stacked, the router's correction bias
  as `exp_probs_b.bias`, the MoE keys (shared experts, leading dense blocks, sigmoid gating,
  weights scale and norm), and the multi-token-prediction layer the releases carry as one more
  block (`nextn_predict_layers`, `block_count` counting it): with the spec's `"nextn": true`, a
  copy of the last layer plus random `nextn.*` tensors, which the import must drop.
"""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np

# config.json model_type -> GGUF architecture.
ARCHITECTURES = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mistral": gguf.MODEL_ARCH.LLAMA,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "gpt_oss": gguf.MODEL_ARCH.GPT_OSS,
    "lfm2": gguf.MODEL_ARCH.LFM2,
    "glm4_moe": gguf.MODEL_ARCH.GLM4_MOE,
}

# mlx-lm's stacked experts (`<moe>.switch_mlp.<proj>`) -> gguf-py's tensor kind.
STACKED_EXPERTS = {
    "gate_proj": gguf.MODEL_TENSOR.FFN_GATE_EXP,
    "up_proj": gguf.MODEL_TENSOR.FFN_UP_EXP,
    "down_proj": gguf.MODEL_TENSOR.FFN_DOWN_EXP,
}


def regroup_rotary_rows(w, heads):
    """llama.cpp's q/k row order: each head's two rotary halves interleaved row by row."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name, arch, name_map):
    layer, sep, rest = name.partition(".switch_mlp.")
    if sep:
        proj, part = rest.split(".")
        bid = int(layer.split(".")[2])
        return gguf.TENSOR_NAMES[STACKED_EXPERTS[proj]].format(bid=bid) + "." + part
    if name.endswith(".sinks"):
        # llama.cpp's converter names the sinks like a weight.
        name += ".weight"
    # ... and DeepSeek-style routers' correction bias like a bias.
    name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    mapped = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
    if mapped is None:
        raise SystemExit(f"gguf_fixture: no GGUF name for {name} ({gguf.MODEL_ARCH_NAMES[arch]})")
    return mapped


def quantized_kinds(weights, spec):
    """The ggml type each tensor of `weights` is stored as, by name: the spec's `"experts"`
    type (e.g. "MXFP4", GPT-OSS's released format) for expert weights, its `"matrices"` type
    (e.g. "Q8_0", or a list taken in turn over the sorted names) for the other 2-D weights
    (embedding and head included, as llama.cpp quantizes them); float32 tensors are absent."""
    kinds, turn = {}, 0
    for name in sorted(weights):
        if not name.endswith(".weight"):
            continue
        kind = None
        if ".mlp.experts." in name:
            kind = spec.get("experts")
        elif weights[name].ndim == 2:
            kind = spec.get("matrices")
            if isinstance(kind, list):
                kind, turn = kind[turn % len(kind)], turn + 1
        if kind:
            kinds[name] = gguf.GGMLQuantizationType[kind]
    return kinds


# K-quant block layouts (ggml's): where each block's float16 scales sit and the magnitude
# drawn for them (values stay near a small model's weights: scale x code up to about 0.1).
K_QUANT_SCALES = {
    gguf.GGMLQuantizationType.Q2_K: ((80, 82), 2e-3),
    gguf.GGMLQuantizationType.Q3_K: ((108,), 8e-4),
    gguf.GGMLQuantizationType.Q4_K: ((0, 2), 1e-4),
    gguf.GGMLQuantizationType.Q5_K: ((0, 2), 5e-5),
    gguf.GGMLQuantizationType.Q6_K: ((208,), 3e-5),
}


def k_quant_blocks(name, shape, kind):
    """Random `kind` blocks for a tensor of `shape`, drawn from a generator seeded by the
    tensor's name (so the checkpoint and the GGUF writer draw the same ones), every float16
    scale finite and small."""
    rng = np.random.default_rng(int.from_bytes(name.encode(), "little") % 2**63)
    blocks = rng.integers(0, 256, size=gguf.quant_shape_to_byte_shape(shape, kind), dtype=np.uint8)
    offsets, magnitude = K_QUANT_SCALES[kind]
    _, type_size = gguf.GGML_QUANT_SIZES[kind]
    per_block = blocks.reshape(-1, type_size)
    for at in offsets:
        scales = rng.uniform(0.25, 1.0, size=per_block.shape[0]) * magnitude
        per_block[:, at : at + 2] = scales.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks


def stored_blocks(name, w, kind):
    """What the GGUF stores for checkpoint tensor `name` (values `w`) as `kind`."""
    if kind in K_QUANT_SCALES:
        return k_quant_blocks(name, w.shape, kind)
    return gguf.quants.quantize(w, kind)


def exact_in_gguf(weights, spec):
    """`weights` with every tensor the GGUF stores quantized replaced by the values it holds
    there (quantized, or for K-quants drawn, then dequantized by gguf-py), so that the checkpoint and the GGUF are the
    same model and the import must reproduce it exactly."""
    out = dict(weights)
    for name, kind in quantized_kinds(weights, spec).items():
        w = np.array(weights[name], dtype=np.float32)
        out[name] = mx.array(gguf.quants.dequantize(stored_blocks(name, w, kind), kind))
    return out


def nextn_layer(config, weights):
    """GLM-4 MoE's multi-token-prediction layer as its releases store it: block
    `num_hidden_layers`, a decoder layer (here a copy of the last) with `eh_proj` and its norms."""
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    last = f"model.layers.{n - 1}."
    layer = {f"model.layers.{n}." + k[len(last):]: v for k, v in weights.items() if k.startswith(last)}
    layer[f"model.layers.{n}.eh_proj.weight"] = mx.random.normal((hidden, 2 * hidden)) * 0.02
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        layer[f"model.layers.{n}.{norm}.weight"] = mx.ones((hidden,))
    return layer


def llama3_rope_freqs(config):
    """The factors llama.cpp's converter stores for Llama 3's RoPE scaling, or None."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") != "llama3":
        return None
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = np.float32(config["rope_theta"])
    freqs = np.float32(1.0) / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    # The converter reads the original context at the top level of config.json, 8192 if absent.
    old = config.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * np.pi) / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(1 / ((1 - smooth) / np.float32(factor) + smooth))
    return np.array(out, dtype=np.float32)


def tensors(config, weights, arch, spec):
    if arch == gguf.MODEL_ARCH.LLAMA and (freqs := llama3_rope_freqs(config)) is not None:
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", freqs, None
    if spec.get("nextn"):
        weights = {**weights, **nextn_layer(config, weights)}
    name_map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"] + 1)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    kinds = quantized_kinds(weights, spec)
    for name, value in weights.items():
        w = np.array(value, dtype=np.float32)
        if arch == gguf.MODEL_ARCH.LFM2 and name.endswith("conv.conv.weight"):
            w = w.reshape(w.shape[0], -1)
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith("self_attn.q_proj.weight"):
            w = regroup_rotary_rows(w, heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and name.endswith("self_attn.k_proj.weight"):
            w = regroup_rotary_rows(w, kv_heads)
        if (kind := kinds.get(name)) is not None:
            q = stored_blocks(name, np.array(value, dtype=np.float32), kind)
            if arch == gguf.MODEL_ARCH.LLAMA and name.endswith("self_attn.q_proj.weight"):
                q = regroup_rotary_rows(q, heads)
            elif arch == gguf.MODEL_ARCH.LLAMA and name.endswith("self_attn.k_proj.weight"):
                q = regroup_rotary_rows(q, kv_heads)
            # exact_in_gguf made the checkpoint hold these values already.
            assert np.array_equal(gguf.quants.dequantize(q, kind), w), name
            yield gguf_name(name, arch, name_map), q, kind
        else:
            yield gguf_name(name, arch, name_map), w, None


def lfm2_ff_dim(config):
    """The MLP width LFM2 builds from `block_ff_dim` (as mlx-lm and llama.cpp's converter do)."""
    ff_dim = config["block_ff_dim"]
    if config["block_auto_adjust_ff_dim"]:
        ff_dim = int(2 * ff_dim / 3)
        if (multiplier := config.get("block_ffn_dim_multiplier")) is not None:
            ff_dim = int(multiplier * ff_dim)
        multiple_of = config["block_multiple_of"]
        ff_dim = multiple_of * ((ff_dim + multiple_of - 1) // multiple_of)
    return ff_dim


def add_hyperparameters(w, config, arch, spec):
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if arch == gguf.MODEL_ARCH.LFM2:
        attends = [t == "full_attention" for t in config["layer_types"]]
        config = {
            **config,
            "intermediate_size": lfm2_ff_dim(config),
            "rms_norm_eps": config["norm_eps"],
            "num_key_value_heads": [config["num_key_value_heads"] if a else 0 for a in attends],
        }
        w.add_shortconv_l_cache(config["conv_L_cache"])
        w.add_vocab_size(config["vocab_size"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    nextn = 1 if spec.get("nextn") else 0
    w.add_block_count(config["num_hidden_layers"] + nextn)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
    if arch == gguf.MODEL_ARCH.QWEN3MOE:
        w.add_expert_count(config["num_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config["model_type"] == "mixtral":
        # As llama.cpp's converter writes Mixtral: no expert_feed_forward_length (the experts
        # are feed_forward_length wide).
        w.add_expert_count(config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
    if arch == gguf.MODEL_ARCH.GLM4_MOE:
        w.add_expert_count(config["n_routed_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
        w.add_expert_shared_count(config["n_shared_experts"])
        w.add_leading_dense_block_count(config["first_k_dense_replace"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(config["routed_scaling_factor"])
        w.add_expert_weights_norm(config["norm_topk_prob"])
        w.add_nextn_predict_layers(nextn)
    if arch == gguf.MODEL_ARCH.GPT_OSS:
        w.add_expert_count(config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["intermediate_size"])
        w.add_sliding_window(config["sliding_window"])
    if (scaling := config.get("rope_scaling")) and scaling.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if arch == gguf.MODEL_ARCH.PHI3:
        w.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings", 4096))


def add_tokenizer(w, config, fixture_dir, pre):
    """Byte-level BPE as llama.cpp's `get_vocab_base` writes it: tokens by id (padded to the
    embedding's rows), added special tokens as control, other added tokens as user-defined."""
    tokenizer = json.loads((fixture_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    added = {t["id"]: t for t in tokenizer.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(fixture_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)


def write_gguf(config, weights, fixture_dir, name, spec):
    arch = ARCHITECTURES[config["model_type"]]
    path = Path(fixture_dir) / f"{name}.gguf"
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(name)
    add_hyperparameters(w, config, arch, spec)
    add_tokenizer(w, config, Path(fixture_dir), spec.get("pre", "smollm"))
    for tensor_name, value, kind in tensors(config, weights, arch, spec):
        w.add_tensor(tensor_name, value, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
