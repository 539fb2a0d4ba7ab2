"""Tiny random-weight vision-language checkpoints for `cargo xtask parity`, built by mlx-vlm's
own model classes, and the test images the vision cases show them.

Usage: python make_vision_fixtures.py CASES_JSON GEMMA3_TOKENIZER_DIR OUT_DIR [SMOLLM2_DIR]
(CASES_JSON: xtask/parity/cases.json or xtask/bench/vision.json; their "vision" model specs.)

For every model in CASES_JSON with a "vision" spec, writes OUT_DIR/<name>/ as a real checkpoint
of its family is laid out: config.json, model.safetensors (the flattened parameters of
`mlx_vlm.models.<family>.Model`, mlx-vlm's weight names), the tokenizer (Gemma 3: Gemma 3
270M's, from GEMMA3_TOKENIZER_DIR, with the family's image token added past its vocabulary as
the real Gemma 3 4B has it; LLaVA: SmolLM2's, from SMOLLM2_DIR, with `<image>` added),
tokenizer_config.json, chat_template.json, preprocessor_config.json and
processor_config.json. Writes the case images to OUT_DIR/images/.
A directory whose spec.json already equals the current spec is left alone.
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from PIL import Image

# Gemma 3's chat template (the template of google/gemma-3-4b-it's processor): image parts become
# `<start_of_image>`, which the processor expands.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# The tiny Gemma 3: two language layers (one sliding, one global), a SigLIP tower of two layers
# on 112 px images (8x8 patches of 14 px), pooled to 4x4 = 16 image tokens. The vocabulary is the
# real one (262208), wider than the tokenizer's (262144 + the image token).
GEMMA3 = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "mm_tokens_per_image": 16,
    "eos_token_id": [1, 106],
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6,
        "sliding_window": 512,
        "sliding_window_pattern": 2,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
        "mm_tokens_per_image": 16,
        "vocab_size": 262208,
        "max_position_embeddings": 32768,
    },
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "patch_size": 14,
        "image_size": 112,
        "layer_norm_eps": 1e-6,
    },
}

GEMMA3_PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor",
    "processor_class": "Gemma3Processor",
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_seq_length": 16,
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 112, "width": 112},
}


def deep_update(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v
    return base


def write_gemma3_tokenizer(src, out):
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({
        "id": 262144, "content": "<image_soft_token>", "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True,
    })
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update({
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
        "extra_special_tokens": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "processor_class": "Gemma3Processor",
    })
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(src / "generation_config.json", out / "generation_config.json")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": GEMMA3_TEMPLATE}, indent=2))


def random_model(family, base, spec, drawn):
    """mlx-vlm's `family.Model` for `base` updated by the spec's "config", its parameters random
    (seeded): `drawn(path, p)` gives a parameter anew (None: keep it). mlx's default init leaves
    the blocks' contributions small and greedy decoding repeats one token; scaled-up block
    matrices (not norms) make attention and MLP, and so the image features, change the tokens.
    Cast to the spec's dtype (bfloat16 by default); returns the model and its config.json."""
    config = deep_update(json.loads(json.dumps(base)), spec.get("config", {}))
    mx.random.seed(spec.get("seed", 0))
    model_config = family.ModelConfig.from_dict(config)
    model_config.text_config = family.TextConfig.from_dict(config["text_config"])
    model_config.vision_config = family.VisionConfig.from_dict(config["vision_config"])
    model = family.Model(model_config)
    scale = spec.get("block_scale", 4.0)

    def scaled(path, p):
        if (new := drawn(path, p)) is not None:
            return new
        if "layers." in path and "norm" not in path and "bias" not in path:
            return p * scale
        return p

    model.update(tree_map_with_path(scaled, model.parameters()))
    dtype = spec.get("dtype", "bfloat16")
    model.set_dtype(getattr(mx, dtype))
    config["torch_dtype"] = dtype
    return model, config


def quantize_like_convert(model, config, spec):
    """With the spec's "quantize" ({"group_size", "bits"}), quantizes `model` as
    `mlx_vlm.convert -q` does: the language model's layers (embedding included), the vision
    tower and projector left as they are; notes it in `config`."""
    from mlx_vlm.utils import skip_multimodal_module

    if not (q := spec.get("quantize")):
        return

    def predicate(path, module):
        if skip_multimodal_module(path) or not hasattr(module, "to_quantized"):
            return False
        return module.weight.size % 64 == 0

    nn.quantize(model, group_size=q["group_size"], bits=q["bits"], class_predicate=predicate)
    config["quantization"] = {"group_size": q["group_size"], "bits": q["bits"], "mode": "affine"}


def build_gemma3(spec, out, tokenizer_dirs):
    tokenizer_dir = tokenizer_dirs["gemma3"]
    from mlx_vlm.models import gemma3

    # The projector is drawn anew: mlx-vlm starts it at ones.
    def projector(path, p):
        if path == "multi_modal_projector.mm_input_projection_weight":
            return mx.random.normal(p.shape) * 0.5
        return None

    model, config = random_model(gemma3, GEMMA3, spec, projector)
    # mlx-vlm ties Gemma 3's head to the embedding (its sanitize copies the table over).
    model.language_model.lm_head.weight = model.language_model.model.embed_tokens.weight
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    if not spec.get("quantize"):
        # Hugging Face's layout: no head. A quantized conversion keeps the head `mlx_vlm.convert`
        # quantized from the tied table, as mlx-community checkpoints do.
        weights.pop("language_model.lm_head.weight")
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_gemma3_tokenizer(tokenizer_dir, out)
    # The processor follows the model: the tower's image size, one token per pooled patch.
    side = config["vision_config"]["image_size"]
    preprocessor = dict(GEMMA3_PREPROCESSOR, size={"height": side, "width": side})
    preprocessor["image_seq_length"] = config["mm_tokens_per_image"]
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {"image_seq_length": config["mm_tokens_per_image"], "processor_class": "Gemma3Processor"}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# LLaVA's chat template (llava-hf/llava-1.5-7b-hf's, with string content rendered as text and
# without its `{% generation %}` markers): `ROLE: `, a message's images first as `<image>\n`,
# then its text; the processor expands `<image>`.
LLAVA_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] != 'system' -%}\n"
    "        {{ message['role'] | upper }}{{ ': ' }}\n"
    "    {%- endif -%}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] + ' ' }}\n"
    "    {%- else -%}\n"
    "        {%- for content in message['content'] -%}\n"
    "            {%- if content['type'] == 'image' -%}{{ '<image>\\n' }}{%- endif -%}\n"
    "        {%- endfor -%}\n"
    "        {%- for content in message['content'] -%}\n"
    "            {%- if content['type'] == 'text' -%}{{ content['text'] + ' ' }}{%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}\n"
)

# The tiny LLaVA: a CLIP tower of three layers on 56 px images (4x4 patches of 14 px and the
# class token; features from the second to last layer, class token dropped: 16 image tokens),
# the two-layer MLP projector, a two-layer Llama. The vocabulary is SmolLM2's plus `<image>`,
# padded to a multiple of 64 as llava-hf pads Llama's.
LLAVA = {
    "model_type": "llava",
    "architectures": ["LlavaForConditionalGeneration"],
    "image_token_index": 49152,
    "projector_hidden_act": "gelu",
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "eos_token_id": [2],
    "text_config": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": 49216,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "patch_size": 14,
        "image_size": 56,
        "projection_dim": 64,
        "layer_norm_eps": 1e-5,
    },
}

# llava-hf/llava-1.5-7b-hf's processor files, at the tower's size.
LLAVA_CLIP_PREPROCESSOR = {
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "processor_class": "LlavaProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
}
LLAVA_SIGLIP_PREPROCESSOR = {
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "SiglipImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "LlavaProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 384, "width": 384},
}


def write_llava_tokenizer(src, out):
    """SmolLM2's tokenizer with `<image>` added after its vocabulary, as LLaVA's have it."""
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    image_id = len(tokenizer["model"]["vocab"])
    tokenizer["added_tokens"].append({
        "id": image_id, "content": "<image>", "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True,
    })
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config.setdefault("added_tokens_decoder", {})[str(image_id)] = {
        "content": "<image>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True,
    }
    config["processor_class"] = "LlavaProcessor"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(src / "generation_config.json", out / "generation_config.json")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": LLAVA_TEMPLATE}, indent=2))
    return image_id


def build_llava(spec, out, tokenizer_dirs):
    from mlx_vlm.models import llava

    # CLIP's class embedding is drawn (mlx-vlm starts it at zeros).
    def class_embedding(path, p):
        return mx.random.normal(p.shape) if path.endswith("class_embedding") else None

    model, config = random_model(llava, LLAVA, spec, class_embedding)
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    image_id = write_llava_tokenizer(tokenizer_dirs["smollm2"], out)
    assert image_id == config["image_token_index"], (image_id, config["image_token_index"])
    vision = config["vision_config"]
    side = vision["image_size"]
    clip = vision["model_type"] == "clip_vision_model"
    if clip:
        preprocessor = dict(LLAVA_CLIP_PREPROCESSOR, crop_size={"height": side, "width": side},
                            size={"shortest_edge": side})
    else:
        preprocessor = dict(LLAVA_SIGLIP_PREPROCESSOR, size={"height": side, "width": side})
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1 if clip else 0,
        "patch_size": vision["patch_size"],
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": config["vision_feature_select_strategy"],
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# Qwen2.5-VL's chat template (Qwen/Qwen2.5-VL-3B-Instruct's): a default system prompt, each
# image part `<|vision_start|><|image_pad|><|vision_end|>`, which the processor expands.
QWEN2_5_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen's vision tokens, added after SmolLM2's vocabulary in this order (their ids in config.json).
QWEN_VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                      "<|video_pad|>"]

# The tiny Qwen2.5-VL: a two-layer Qwen2 language model with M-RoPE (head 16: sections 2+3+3 of
# its 8 frequencies), a four-block windowed tower (blocks 1 and 3 attend to the whole image;
# windows of 4x4 merged patches) on images the processor resizes to at most 64 merged patches.
# The text settings sit at the top level, as Qwen's checkpoints have them.
QWEN2_5_VL = {
    "model_type": "qwen2_5_vl",
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "max_position_embeddings": 32768,
    "vocab_size": 49216,
    "tie_word_embeddings": True,
    "vision_start_token_id": 49152,
    "vision_end_token_id": 49153,
    "vision_token_id": 49154,
    "image_token_id": 49155,
    "video_token_id": 49156,
    "eos_token_id": [2],
    "text_config": {},
    "vision_config": {
        "model_type": "qwen2_5_vl",
        "depth": 4,
        "hidden_size": 64,
        "intermediate_size": 128,
        "out_hidden_size": 64,
        "num_heads": 4,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1, 3],
    },
}

# Qwen2.5-VL's preprocessor_config.json, with a small pixel budget (at most 64 merged patches).
QWEN2_5_VL_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 28 * 28 * 64,
    "merge_size": 2,
    "min_pixels": 28 * 28 * 4,
    "patch_size": 14,
    "processor_class": "Qwen2_5_VLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "temporal_patch_size": 2,
}


# Qwen3-VL's chat template (Qwen/Qwen3-VL-2B-Instruct's, its tool-call and reasoning branches
# left out): no default system prompt, each image part `<|vision_start|><|image_pad|><|vision_end|>`.
QWEN3_VL_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{ content['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

# The tiny Qwen3-VL: a three-layer Qwen3 language model (q/k norms, head_dim 32 wider than
# hidden / heads) with interleaved M-RoPE (sections 6+5+5 of its 16 frequencies), a three-block
# tower on 16 px patches whose first two blocks feed deepstack (added after language layers 0
# and 1), position embeddings from a 6x6 table interpolated to the grid, images resized to at
# most 64 merged patches. The text settings sit under `text_config`, as mlx-vlm reads them.
QWEN3_VL = {
    "model_type": "qwen3_vl",
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 49155,
    "video_token_id": 49156,
    "vision_start_token_id": 49152,
    "vision_end_token_id": 49153,
    "tie_word_embeddings": True,
    "eos_token_id": [2],
    "text_config": {
        "model_type": "qwen3_vl_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True},
        "max_position_embeddings": 32768,
        "vocab_size": 49216,
        "tie_word_embeddings": True,
    },
    "vision_config": {
        "model_type": "qwen3_vl",
        "depth": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "out_hidden_size": 64,
        "num_heads": 4,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 36,
        "deepstack_visual_indexes": [0, 1],
    },
}

# The tiny Qwen3-VL-MoE: the tiny Qwen3-VL with Qwen3-MoE's experts (4 of 64, top 2,
# renormalised) in layers 1 and 2 (layer 0 dense: `mlp_only_layers`), the tower Qwen3-VL's
# (mlx-vlm's qwen3_vl_moe swaps its two GELUs: exact in the blocks, tanh in the mergers).
QWEN3_VL_MOE = {
    **QWEN3_VL,
    "model_type": "qwen3_vl_moe",
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "text_config": {
        **QWEN3_VL["text_config"],
        "model_type": "qwen3_vl_moe_text",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        "norm_topk_prob": True,
    },
    "vision_config": {**QWEN3_VL["vision_config"], "model_type": "qwen3_vl_moe"},
}

# Qwen3-VL's preprocessor_config.json (its sizes as `size`), with a small pixel budget.
QWEN3_VL_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "processor_class": "Qwen3VLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 32 * 32 * 64, "shortest_edge": 32 * 32 * 4},
    "temporal_patch_size": 2,
}


def write_qwen_vl_tokenizer(src, out, first_id, processor_class="Qwen2_5_VLProcessor",
                            template=QWEN2_5_VL_TEMPLATE):
    """SmolLM2's tokenizer with Qwen2's pipeline (as transformers 5 builds a Qwen2 tokenizer) and
    Qwen's vision tokens added after its vocabulary."""
    from make_fixtures import TOKENIZER_PIPELINES

    tokenizer = json.loads((src / "tokenizer.json").read_text())
    tokenizer.update(TOKENIZER_PIPELINES["qwen2"])
    assert len(tokenizer["model"]["vocab"]) == first_id, len(tokenizer["model"]["vocab"])
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    for i, token in enumerate(QWEN_VISION_TOKENS):
        entry = {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        tokenizer["added_tokens"].append({"id": first_id + i, **entry})
        config.setdefault("added_tokens_decoder", {})[str(first_id + i)] = entry
    config["processor_class"] = processor_class
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(src / "generation_config.json", out / "generation_config.json")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2))


def build_qwen2_5_vl(spec, out, tokenizer_dirs):
    from mlx_vlm.models import qwen2_5_vl

    build_qwen2_vl_like(qwen2_5_vl, QWEN2_5_VL, "Qwen2_5_VLProcessor", spec, out, tokenizer_dirs)


def build_qwen2_vl_like(family, base, processor_class, spec, out, tokenizer_dirs):
    """Qwen2-VL and Qwen2.5-VL: the text settings at the top level, Qwen2.5-VL's template."""
    model, config = random_model(family, base, spec, lambda path, p: None)
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    if layout := spec.get("layout"):
        weights = qwen_vl_layout(weights, layout)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    # mlx-vlm's ModelConfig copied the top level into `text_config`; Qwen's checkpoints have none.
    config.pop("text_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_qwen_vl_tokenizer(tokenizer_dirs["smollm2"], out, config["vision_start_token_id"],
                            processor_class)
    # A spec's "max_pixels" widens the budget (prompts past one prefill chunk).
    preprocessor = dict(QWEN2_5_VL_PREPROCESSOR, processor_class=processor_class)
    preprocessor["max_pixels"] = spec.get("max_pixels", preprocessor["max_pixels"])
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {"processor_class": processor_class}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# Checkpoint layouts other than mlx-vlm's: transformers 5's and Qwen's original one.
QWEN_VL_LAYOUTS = {
    "transformers": (("vision_tower.", "model.visual."),
                     ("language_model.model.", "model.language_model."),
                     ("language_model.lm_head.", "lm_head.")),
    "qwen": (("vision_tower.", "visual."),
             ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head.")),
}


def qwen_vl_layout(weights, layout):
    """mlx-vlm's names and Conv3d layout turned into `layout`'s names (QWEN_VL_LAYOUTS) and
    PyTorch's convolution layout `(out, in, t, p, p)`."""
    out = {}
    for name, w in weights.items():
        if name == "vision_tower.patch_embed.proj.weight":
            w = w.transpose(0, 4, 1, 2, 3)
        for old, new in QWEN_VL_LAYOUTS[layout]:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out[name] = w
    return out


def build_qwen3_vl(spec, out, tokenizer_dirs):
    from mlx_vlm.models import qwen3_vl

    build_qwen3_vl_like(qwen3_vl, QWEN3_VL, spec, out, tokenizer_dirs)


def build_qwen3_vl_moe(spec, out, tokenizer_dirs):
    from mlx_vlm.models import qwen3_vl_moe

    build_qwen3_vl_like(qwen3_vl_moe, QWEN3_VL_MOE, spec, out, tokenizer_dirs)


def build_qwen3_vl_like(family, base, spec, out, tokenizer_dirs):
    """Qwen3-VL and Qwen3-VL-MoE: the text settings under `text_config`, Qwen3-VL's template."""
    model, config = random_model(family, base, spec, lambda path, p: None)
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    if layout := spec.get("layout"):
        weights = qwen_vl_layout(weights, layout)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_qwen_vl_tokenizer(tokenizer_dirs["smollm2"], out, config["vision_start_token_id"],
                            "Qwen3VLProcessor", QWEN3_VL_TEMPLATE)
    # A spec's "max_pixels" widens the budget, a smaller patch makes more tokens of an image
    # (prompts past one prefill chunk).
    preprocessor = json.loads(json.dumps(QWEN3_VL_PREPROCESSOR))
    preprocessor["size"]["longest_edge"] = spec.get("max_pixels", preprocessor["size"]["longest_edge"])
    preprocessor["patch_size"] = config["vision_config"]["patch_size"]
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {"processor_class": "Qwen3VLProcessor"}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# The tiny Qwen2-VL: a two-layer Qwen2 language model with chunked M-RoPE (sections 2+3+3), a
# three-block tower of LayerNorm blocks over whole images (`embed_dim` 64, MLP 2x wide) on 14 px
# patches, images resized to at most 64 merged patches. Text settings as Qwen2.5-VL's.
QWEN2_VL = {
    **QWEN2_5_VL,
    "model_type": "qwen2_vl",
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "text_config": {},
    "vision_config": {
        "model_type": "qwen2_vl",
        "depth": 3,
        "embed_dim": 64,
        "hidden_size": 64,
        "num_heads": 4,
        "mlp_ratio": 2,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


def build_qwen2_vl(spec, out, tokenizer_dirs):
    from mlx_vlm.models import qwen2_vl

    build_qwen2_vl_like(qwen2_vl, QWEN2_VL, "Qwen2VLProcessor", spec, out, tokenizer_dirs)


# SmolVLM's chat template (HuggingFaceTB/SmolVLM-256M-Instruct's), with string content rendered
# as text: `<|im_start|>`, then per message `Role:` and its parts in order, an image part as
# `<image>` (the processor expands it into tiles), `<end_of_utterance>\n`. Idefics3's is the same
# after its own `<|begin_of_text|>`; the SmolLM2 tokenizer of these fixtures has `<|im_start|>`.
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# The tiny Idefics3: a SigLIP tower of two layers on 80 px tiles (10x10 patches of 8 px: a grid
# whose bucketed position ids repeat some rows, as mlx-vlm computes them), pixel shuffle by 2 (25
# image tokens per tile), a two-layer Llama. Images are resized to 160 px on the long side and
# split into 2x2 tiles plus the global image. The vocabulary is SmolLM2's plus the image tokens
# (as SmolVLM's: `<global-img>`, `<row_r_col_c>`, `<fake_token_around_image>`, `<image>`,
# `<end_of_utterance>`), padded to a multiple of 64.
IDEFICS3 = {
    "model_type": "idefics3",
    "architectures": ["Idefics3ForConditionalGeneration"],
    "image_token_id": 49190,
    "scale_factor": 2,
    "eos_token_id": [2, 49191],
    "text_config": dict(LLAVA["text_config"], rope_theta=100000.0, max_position_embeddings=8192),
    "vision_config": {
        "model_type": "idefics3_vision",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "patch_size": 8,
        "image_size": 80,
        "layer_norm_eps": 1e-6,
    },
}

# Idefics3's / SmolVLM's processor files (`size` and `max_image_size` scaled down); a spec's
# "processor" updates them.
IDEFICS3_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 80},
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 160},
}
IDEFICS3_CLASSES = {
    "idefics3": ("Idefics3ImageProcessor", "Idefics3Processor"),
    "smolvlm": ("SmolVLMImageProcessor", "SmolVLMProcessor"),
}


def write_idefics3_tokenizer(src, out, processor_class):
    """SmolLM2's tokenizer with SmolVLM's image tokens added after its vocabulary."""
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    names = ["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    names += ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
    first = len(tokenizer["model"]["vocab"])
    for i, name in enumerate(names):
        token = {"content": name, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
        tokenizer["added_tokens"].append(dict(token, id=first + i))
        config.setdefault("added_tokens_decoder", {})[str(first + i)] = token
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config["processor_class"] = processor_class
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": IDEFICS3_TEMPLATE}, indent=2))
    return {name: first + i for i, name in enumerate(names)}


def idefics3_transformers_layout(weights):
    """mlx-vlm's names and layout as transformers saves them: `model.vision_model.*`,
    `model.connector.*`, `model.text_model.*`, `lm_head.*`, the patch convolution in PyTorch's
    (out, in, kh, kw)."""
    out = {}
    for name, w in weights.items():
        if name.startswith("language_model.lm_head."):
            name = name[len("language_model."):]
        elif name.startswith("language_model."):
            name = "model.text_model." + name[len("language_model."):]
        else:
            name = "model." + name
        if name.endswith("patch_embedding.weight"):
            w = w.transpose(0, 3, 1, 2)
        out[name] = w
    return out


def build_idefics3(spec, out, tokenizer_dirs):
    """Idefics3 or SmolVLM (the spec's "family"; mlx-vlm's smolvlm is idefics3's model)."""
    import importlib

    family = importlib.import_module(f"mlx_vlm.models.{spec['family']}")
    base = dict(IDEFICS3, model_type=spec["family"])
    model, config = random_model(family, base, spec, lambda path, p: None)
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    if spec.get("layout") == "transformers":
        weights = idefics3_transformers_layout(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    image_class, processor_class = IDEFICS3_CLASSES[spec["family"]]
    ids = write_idefics3_tokenizer(tokenizer_dirs["smollm2"], out, processor_class)
    assert ids["<image>"] == config["image_token_id"], (ids, config["image_token_id"])
    # A turn ends with `<end_of_utterance>`, in generation_config.json too: mlx-vlm takes its
    # `eos_token_id` over config.json's, the worker both.
    generation = json.loads((tokenizer_dirs["smollm2"] / "generation_config.json").read_text())
    generation["eos_token_id"] = config["eos_token_id"]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    preprocessor = deep_update(json.loads(json.dumps(IDEFICS3_PREPROCESSOR)), spec.get("processor", {}))
    preprocessor.update(image_processor_type=image_class, processor_class=processor_class)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    # Tokens per tile follow the model: the tile's patch grid shrunk by the pixel shuffle.
    grid = preprocessor["max_image_size"]["longest_edge"] // config["vision_config"]["patch_size"]
    image_seq_len = (grid // config["scale_factor"]) ** 2
    processor = {"image_seq_len": image_seq_len, "processor_class": processor_class}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


# Mistral 3's chat template, shortened (mistralai/Mistral-Small-3.1-24B-Instruct-2503's writes
# `[IMG]` for each image part in the host's order, between the text parts).
MISTRAL3_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] == 'user' -%}{{ '[INST]' }}\n"
    "    {%- elif message['role'] == 'system' -%}{{ '[SYSTEM_PROMPT]' }}{%- endif -%}\n"
    "    {%- if message['content'] is string -%}{{ message['content'] }}\n"
    "    {%- else -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'text' -%}{{ item['text'] }}\n"
    "            {%- elif item['type'] == 'image' -%}{{ '[IMG]' }}{%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {%- if message['role'] == 'user' -%}{{ '[/INST]' }}\n"
    "    {%- elif message['role'] == 'system' -%}{{ '[/SYSTEM_PROMPT]' }}\n"
    "    {%- else -%}{{ eos_token }}{%- endif -%}\n"
    "{%- endfor -%}\n"
)

# The tiny Mistral 3: a Pixtral tower of two layers (2-D RoPE, images fitted into 112 px in
# patches of 14, so up to 8x8 patches), the projector merging 2x2 patches, a two-layer Llama
# (Mistral Small's `mistral` text model). SmolLM2's vocabulary plus `[IMG]`, `[IMG_BREAK]`,
# `[IMG_END]`, padded to a multiple of 64.
MISTRAL3 = {
    "model_type": "mistral3",
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 49152,
    "spatial_merge_size": 2,
    "vision_feature_layer": -1,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "eos_token_id": [2],
    "text_config": {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "vocab_size": 49216,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "pixtral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "head_dim": 16,
        "image_size": 112,
        "patch_size": 14,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
    },
}
MISTRAL3_IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def build_mistral3(spec, out, tokenizer_dirs):
    from mlx_vlm.models import mistral3

    model, config = random_model(mistral3, MISTRAL3, spec, lambda path, p: None)
    quantize_like_convert(model, config, spec)
    weights = dict(tree_flatten(model.parameters()))
    if spec.get("layout") == "transformers":
        # transformers 5's names: the tower without `vision_model`, under `model.`.
        renamed = {}
        for k, v in weights.items():
            if k.startswith("vision_tower.vision_model."):
                k = "model.vision_tower." + k.removeprefix("vision_tower.vision_model.")
            elif k.startswith("multi_modal_projector."):
                k = "model." + k
            elif k.startswith("language_model.model."):
                k = "model.language_model." + k.removeprefix("language_model.model.")
            elif k.startswith("language_model.lm_head"):
                k = k.removeprefix("language_model.")
            renamed[k] = v
        weights = renamed
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    src = tokenizer_dirs["smollm2"]
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    first = len(tokenizer["model"]["vocab"])
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    tok_config.pop("chat_template", None)
    for i, content in enumerate(MISTRAL3_IMAGE_TOKENS):
        entry = {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
        tokenizer["added_tokens"].append(dict(entry, id=first + i))
        tok_config.setdefault("added_tokens_decoder", {})[str(first + i)] = entry
    assert first == config["image_token_index"], (first, config["image_token_index"])
    tok_config["processor_class"] = "PixtralProcessor"
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    shutil.copy(src / "generation_config.json", out / "generation_config.json")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": MISTRAL3_TEMPLATE}, indent=2))
    vision = config["vision_config"]
    preprocessor = {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "PixtralImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": {"height": vision["patch_size"], "width": vision["patch_size"]},
        "processor_class": "PixtralProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": vision["image_size"]},
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    processor = {
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
        "patch_size": vision["patch_size"], "processor_class": "PixtralProcessor",
        "spatial_merge_size": config["spatial_merge_size"],
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))


BUILDERS = {
    "mistral3": build_mistral3,
    "gemma3": build_gemma3,
    "llava": build_llava,
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "qwen3_vl": build_qwen3_vl,
    "qwen3_vl_moe": build_qwen3_vl_moe,
    "idefics3": build_idefics3,
    "smolvlm": build_idefics3,
}


def write_images(out):
    """The case images: deterministic, in the formats and modes hosts send."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:300, 0:400]
    gradient = np.stack([x * 255 // 399, y * 255 // 299, (x + y) * 255 // 698], -1).astype(np.uint8)
    Image.fromarray(gradient).save(out / "gradient.png")
    noise = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    Image.fromarray(noise).save(out / "noise.jpg", quality=90)
    rgba = np.concatenate([gradient[:90, :120], rng.integers(0, 256, (90, 120, 1), dtype=np.uint8)], -1)
    Image.fromarray(rgba, "RGBA").save(out / "rgba.png")
    Image.fromarray(gradient[:, :, 0]).save(out / "gray.webp", lossless=True)
    # What Studio sends: one PNG of at most 800 px (a smooth picture with some texture).
    y, x = np.mgrid[0:600, 0:800]
    photo = np.stack([x * 255 // 799, y * 255 // 599, 128 + 64 * np.sin(x / 37.0) * np.cos(y / 23.0)], -1)
    photo = np.clip(photo + rng.normal(0, 6, photo.shape), 0, 255).astype(np.uint8)
    Image.fromarray(photo).save(out / "photo_800x600.png")


def main():
    cases = json.loads(Path(sys.argv[1]).read_text())
    root = Path(sys.argv[3])
    tokenizer_dirs = {"gemma3": Path(sys.argv[2])}
    if len(sys.argv) > 4:
        tokenizer_dirs["smollm2"] = Path(sys.argv[4])
    write_images(root / "images")
    for model in cases["models"]:
        spec = model.get("vision")
        if spec is None:
            continue
        out = root / model["name"]
        spec_text = json.dumps(spec, sort_keys=True)
        if (out / "spec.json").is_file() and (out / "spec.json").read_text() == spec_text:
            continue
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        BUILDERS[spec["family"]](spec, tmp, tokenizer_dirs)
        (tmp / "spec.json").write_text(spec_text)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        print(f"fixture {model['name']}: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
