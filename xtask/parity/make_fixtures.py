"""Tiny random-weight checkpoints for `cargo xtask parity`, built by mlx-lm's own classes.

Usage: python make_fixtures.py CASES_JSON TOKENIZER_DIR OUT_DIR

For every model in CASES_JSON with a "fixture" spec, writes OUT_DIR/<name>/ in Hugging Face
layout: config.json, model.safetensors (the flattened parameters of the `Model` class mlx-lm
itself picks for the config's model_type: `mlx_lm.models.<type>.Model`, or the module
mlx-lm maps the type to, e.g. mistral -> llama), and the tokenizer files copied from
TOKENIZER_DIR; with a "gguf" spec also `<name>.gguf`, the same checkpoint as llama.cpp would
write it (gguf_fixture.py).
A directory whose spec.json already equals the current spec is left alone.
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import _get_classes

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]


# What a family's tiny config adds to or changes in the Llama base (before the spec's own
# "config"). Every family keeps hidden 64 and the SmolLM2 vocabulary.
FAMILY_BASE = {
    "llama": {},
    "mistral": {"architectures": ["MistralForCausalLM"], "tie_word_embeddings": False},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "rope_theta": 1000000.0, "head_dim": 32},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "tie_word_embeddings": False},
    # Four layers, so that some run without RoPE (which ones: the spec's config).
    "smollm3": {"architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 4},
    "olmo2": {"architectures": ["Olmo2ForCausalLM"]},
    # YaRN RoPE and the attention temperature, both from `rope_parameters`; an original context
    # of 64 so that the temperature steps up within every case's prompt.
    "ministral3": {
        "architectures": ["Ministral3ForCausalLM"],
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    },
    # Mixtures of experts: 4 experts, top 2, expert MLPs of 64 (groups of 64 when quantized).
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "rope_theta": 1000000.0,
        "head_dim": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "tie_word_embeddings": False,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "olmoe": {
        "architectures": ["OlmoeForCausalLM"],
        "intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    # GPT-OSS: 4 experts, top 2, sliding (window 16, shorter than every case's prompt) and
    # full layers alternating, YaRN RoPE as the released models have it.
    "gpt_oss": {
        "architectures": ["GptOssForCausalLM"],
        "tie_word_embeddings": False,
        "head_dim": 32,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        "max_position_embeddings": 131072,
        "swiglu_limit": 7.0,
    },
    # GLM-4-MoE: layer 0 dense (first_k_dense_replace), layers 1-2 sparse: 8 experts in 4 groups,
    # the best 2 groups used, top 2 (the router's correction bias, zero at init, needs "drawn"),
    # a shared expert; q/k/v biases, half of each head rotated.
    "glm4_moe": {
        "architectures": ["Glm4MoeForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": True,
        "use_qk_norm": False,
        "tie_word_embeddings": False,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 64,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
    },
    # Hybrid attention: gated delta-net layers (0, 2) beside full-attention ones (1, 3), 2 key
    # heads read by 4 value heads, 8 of 32 head features rotated; MoE with a shared expert.
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "rope_theta": 1000000.0,
        "head_dim": 32,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    # Qwen3.5 text: the same hybrid layers, separate delta-net projections, dense MLPs.
    "qwen3_5": {
        "architectures": ["Qwen3_5ForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "tie_word_embeddings": False,
    },
    # Multi-head latent attention over 4 heads (latent rank 64, rotary part 16) and, after one
    # dense layer, 8 experts in 2 groups (top 2 within the best group) plus a shared expert.
    # Ranks and head parts of 64 so that every matrix quantizes in groups of 64.
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 64,
        "v_head_dim": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    # Four layers, as mlx-lm's default `layer_types` makes them: three sliding (a window of 16,
    # shorter than every case's prompt) with plain RoPE, the fourth full (with the spec's
    # `rope_scaling`, if any).
    "olmo3": {
        "architectures": ["Olmo3ForCausalLM"],
        "num_hidden_layers": 4,
        "sliding_window": 16,
        "tie_word_embeddings": False,
    },
    # Four layers of "LLLG": three local (window 16, RoPE), one global without RoPE. mlx-lm
    # requires `rope_scaling` and the window fields to be present.
    "exaone4": {
        "architectures": ["Exaone4ForCausalLM"],
        "num_hidden_layers": 4,
        "head_dim": 32,
        "rope_scaling": None,
        "sliding_window": 16,
        "sliding_window_pattern": "LLLG",
        # As the released config.json has it (transformers' config cannot derive it from a
        # string pattern; mlx-lm reads the pattern).
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "tie_word_embeddings": False,
    },
    # Biases on q/k/v and the MLP (the released 36B's choice), none on o.
    "seed_oss": {
        "architectures": ["SeedOssForCausalLM"],
        "head_dim": 32,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": False,
    },
    # Biases on every projection (`use_bias`), traditional RoPE, head_dim from the heads.
    "ernie4_5": {
        "architectures": ["Ernie4_5_ForCausalLM"],
        "head_dim": None,
        "use_bias": True,
        "rope_theta": 500000.0,
    },
    # Layer 0 dense, layers 1-2 sparse (moe_layer_start_index): 8 experts, top 2, expert MLPs
    # of 64, one shared expert (the released 21B-A3B's shape, scaled down).
    "ernie4_5_moe": {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": None,
        "use_bias": False,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_layer_start_index": 1,
        "moe_layer_interval": 1,
        "moe_intermediate_size": 64,
        "moe_num_shared_experts": 1,
    },
    # MiniMax-M2's shape scaled down: heads wider than hidden / heads, half of each rotated,
    # q/k norms over the projections; 4 experts (Hugging Face's `w1`/`w3`/`w2`), top 2, routed by
    # sigmoid scores plus a correction bias (zero at init, so the cases "draw" it).
    "minimax": {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "head_dim": 32,
        "rotary_dim": 16,
        "rope_theta": 5000000.0,
        "intermediate_size": 64,
        "shared_intermediate_size": 0,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
        "use_qk_norm": True,
    },
    # Command R7B's layout scaled down: four layers, three sliding (window 16, shorter than
    # every case's prompt; traditional RoPE) and a global one without RoPE; layer norms without
    # an offset, attention and MLP side by side on one norm, logits scaled.
    "cohere2": {
        "architectures": ["Cohere2ForCausalLM"],
        "num_hidden_layers": 4,
        "head_dim": 16,
        "layer_norm_eps": 1e-5,
        "sliding_window": 16,
        "sliding_window_pattern": 4,
        "logit_scale": 0.25,
        "rope_theta": 50000.0,
    },
    # LFM2-350M's layout scaled down: short convolutions (3 taps) in layers 0, 1 and 3,
    # attention in layer 2; MLPs of 192 * 2/3 rounded up to a multiple of 64.
    "lfm2": {
        "architectures": ["Lfm2ForCausalLM"],
        "num_hidden_layers": 4,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_ff_dim": 192,
        "block_multiple_of": 64,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "rope_theta": 1000000.0,
        "layer_types": ["conv", "conv", "full_attention", "conv"],
    },
    # LFM2-8B-A1B's layout scaled down: LFM2's layers, the MLP of layer 0 dense, of the others
    # 4 experts (top 2) chosen by sigmoid scores plus an expert bias (zero at init: the cases
    # "draw" it), renormalised and scaled.
    "lfm2_moe": {
        "architectures": ["Lfm2MoeForCausalLM"],
        "num_hidden_layers": 4,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "moe_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "use_expert_bias": True,
        "num_dense_layers": 1,
        "routed_scaling_factor": 1.5,
        "rope_theta": 1000000.0,
        "layer_types": ["conv", "conv", "full_attention", "conv"],
    },
    # Kimi Linear's layout scaled down: KDA in layers 1, 2 and 4 (counted from 1; 4 heads of
    # 16, 4 taps), latent attention without positions in layer 3 (unrotated rotary features);
    # the MLP of layer 0 dense, of the others 4 experts (top 2, in 2 groups of which the best 1
    # is used) plus a shared expert, routed by sigmoid scores and a correction bias the cases
    # draw, renormalised and scaled.
    "kimi_linear": {
        "architectures": ["KimiLinearForCausalLM"],
        "num_hidden_layers": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "mla_use_nope": True,
        "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4},
        "model_max_length": 4096,
        "num_experts": 4,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "num_expert_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.446,
        "tie_word_embeddings": False,
    },
    # Nemotron-H's layout scaled down: one-sublayer blocks, Mamba2 (8 heads of 16 in 2 groups,
    # state 16, 4 taps), a ReLU² MLP, attention without positions, experts (4, top 2, in 2
    # groups of which the best 1 is used, a shared expert, a correction bias the cases draw).
    # Time steps clipped to [0, inf], written as Python writes it (`Infinity`).
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"],
        "head_dim": 16,
        "attention_bias": False,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 2,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": "M-M*EM",
        "moe_intermediate_size": 64,
        "moe_shared_expert_intermediate_size": 64,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "time_step_limit": [0.0, float("inf")],
        "tie_word_embeddings": False,
    },
    # Granite 4.0-H's layout scaled down: Mamba2 layers (8 heads of 16 in 2 groups, state 16,
    # 4 taps; one norm over every head) around one attention layer without positions (Granite
    # 4.0-H's `nope`); 4 experts (top 2) plus a shared MLP; Granite's multipliers.
    "granitemoehybrid": {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": ["mamba", "mamba", "attention", "mamba"],
        "intermediate_size": 64,
        "shared_intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_n_groups": 2,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "attention_bias": False,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.0625,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "position_embedding_type": "nope",
        "rope_theta": 10000.0,
    },
    # Falcon-H1's layout scaled down: three layers of Mamba2 (8 heads of 16 in 2 groups, state
    # 16, 4 taps) beside attention (4 heads of 16, 2 KV heads), Falcon-H1-0.5B's multipliers
    # (mlx-lm's defaults).
    "falcon_h1": {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 16,
        "mamba_d_ssm": 128,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_n_groups": 2,
        "mamba_d_conv": 4,
        "rope_theta": 100000000000.0,
    },
    # Mamba2 alone (Mamba-Codestral's layout scaled down): two blocks of 8 heads of 16 in 2
    # groups, state 16, 4 taps.
    "mamba2": {
        "architectures": ["Mamba2ForCausalLM"],
        "num_heads": 8,
        "head_dim": 16,
        "state_size": 16,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 2,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_limit": [0.0, float("inf")],
        "time_step_rank": "auto",
    },
    # Mamba (the first) scaled down: two blocks of 128 channels, state 16, 4 taps, a time-step
    # rank of `ceil(64 / 16)` = 4.
    "mamba": {
        "architectures": ["MambaForCausalLM"],
        "state_size": 16,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": "auto",
    },
    # Llama 4 (Scout's text config, scaled down; run under the `llama4` wrapper): layers 0-2
    # chunked (16 positions, shorter than most prompts) with Llama 3 RoPE and q/k norms, layer 3
    # global without RoPE, its query temperature stepping every 16 positions (Scout: 8192);
    # layers 1 and 3 of 4 experts (top 1) plus a shared expert, the others dense.
    "llama4": {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "attention_bias": False,
        "attention_chunk_size": 16,
        "interleave_moe_layer_step": 2,
        "intermediate_size": 64,
        "intermediate_size_mlp": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "use_qk_norm": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 16.0,
            "high_freq_factor": 1.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "attn_temperature_tuning": True,
        "floor_scale": 16,
        "attn_scale": 0.1,
        "tie_word_embeddings": False,
    },
    # MobileLLM-R1's layout (mlx-lm's llama4_text.py): 4 layers, the last without RoPE,
    # unscaled q/k norms, tied.
    "llama4_text": {
        "architectures": ["Llama4ForCausalLM"],
        "num_hidden_layers": 4,
        "head_dim": 16,
        "intermediate_size_mlp": 128,
        "no_rope_layers": [1, 1, 1, 0],
        "use_qk_norm": True,
        "rope_theta": 500000.0,
    },
    # Two layers: layer 0 sliding-window (local RoPE base), layer 1 global. The window covers
    # every case's prompt + generation (mlx-lm's rotating cache then equals a plain one).
    "gemma3_text": {
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 256,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 32768,
    },
    # Three layers, every third one full attention (sliding_window_pattern 3): sliding layers
    # of head 32 with a window of 32 (shorter than most cases' prompts) and default RoPE, the
    # full layer of head 64 with proportional RoPE over a quarter of it. No per-layer inputs and
    # no shared KV (mlx-lm's defaults for both are E2B's, so they are set to 0).
    "gemma4_text": {
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 32,
        "global_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "sliding_window": 32,
        "sliding_window_pattern": 3,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
}
# mlx-lm runs Falcon Mamba as Mamba, with the time steps, B and C RMS-normalised.
FAMILY_BASE["falcon_mamba"] = {**FAMILY_BASE["mamba"], "architectures": ["FalconMambaForCausalLM"]}
# mlx-lm runs Kimi K2 as DeepSeek-V3 (`MODEL_REMAPPING`); GLM-4.7-Flash's file is a copy of
# DeepSeek-V3's with other defaults and two epsilons.
FAMILY_BASE["kimi_k2"] = FAMILY_BASE["deepseek_v3"]
# DeepSeek-V3.2: DeepSeek-V3's sizes and an indexer of 4 heads of 32 keeping 24 keys per query
# (fewer than every case's prompt, so every pass is sparse; the releases keep 2048).
FAMILY_BASE["deepseek_v32"] = {
    **FAMILY_BASE["deepseek_v3"],
    "architectures": ["DeepseekV32ForCausalLM"],
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 24,
}
# GLM-5 (glm_moe_dsa): the same, every field given, RoPE from `rope_parameters`.
FAMILY_BASE["glm_moe_dsa"] = {
    **FAMILY_BASE["deepseek_v32"],
    "architectures": ["GlmMoeDsaForCausalLM"],
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "moe_layer_freq": 1,
    "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
# MiniMax-M2's checkpoints say `minimax_m2`, which mlx-lm runs as `minimax`.
FAMILY_BASE["minimax_m2"] = FAMILY_BASE["minimax"]
# Mistral 4: DeepSeek-V3's sizes; RoPE, YaRN and Llama 4's query scale from `rope_parameters`
# (an original context of 32, so that the scale steps up within every case's prompt).
FAMILY_BASE["mistral4"] = {
    **FAMILY_BASE["deepseek_v3"],
    "architectures": ["Mistral4ForCausalLM"],
    "norm_topk_prob": True,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
}
# Gemma 3n: mlx-lm's own class is the multimodal wrapper (`text_config`, the language model under
# `model.language_model.`, as Hugging Face ships it). Four layers, the last two sharing the keys
# and values of the first two (one sliding of window 16, one full), 4 AltUp streams, LAuReL of
# rank 64, sparse GeGLU in the first two, per-layer inputs of 16 (4 x 16: one quantization
# group) from a table shorter than the vocabulary (tokens past it read row 0).
GEMMA3N_TEXT = {
    "model_type": "gemma3n_text",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "head_dim": 32,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 49152,
    "vocab_size_per_layer_input": 40000,
    "num_kv_shared_layers": 2,
    "sliding_window": 16,
    "max_position_embeddings": 2048,
    "rope_local_base_freq": 10000.0,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "final_logit_softcapping": 30.0,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
    "hidden_size_per_layer_input": 16,
    "altup_num_inputs": 4,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    "altup_active_idx": 0,
    "laurel_rank": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FAMILY_BASE["glm4_moe_lite"] = {
    **FAMILY_BASE["deepseek_v3"],
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "rms_norm_eps": 1e-5,
}


# Pre-tokenization a family's real tokenizer.json carries, for fixtures whose spec asks for it
# ("tokenizer": FAMILY). transformers 5 builds the tokenizer of some model_types from its own
# class (qwen2 -> Qwen2Tokenizer, with Qwen2's split regex and NFC) whatever tokenizer.json says;
# a real checkpoint of that family has the same pipeline in tokenizer.json, so the fixture's
# copy of the SmolLM2 tokenizer is given it too and both sides read the same pipeline.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's: letters may carry combining marks (`\p{M}`).
QWEN3_5_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# Llama 3's, Mistral's Tekken and GPT-4o's (o200k, GPT-OSS's) split rules, for GGUF fixtures
# whose `tokenizer.ggml.pre` names them (llama-bpe, tekken, gpt-4o); those tokenizers do not
# normalize.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def split_then_bytes(pattern, nfc=True):
    return {
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
    }


TOKENIZER_PIPELINES = {
    "qwen2": split_then_bytes(QWEN2_SPLIT),
    "qwen3_5": split_then_bytes(QWEN3_5_SPLIT),
    "llama3": split_then_bytes(LLAMA3_SPLIT, nfc=False),
    "tekken": split_then_bytes(TEKKEN_SPLIT, nfc=False),
    "gpt-4o": split_then_bytes(GPT4O_SPLIT, nfc=False),
}


def write_tokenizer(spec, out):
    """The SmolLM2 tokenizer files, with the family pipeline the spec names, if any."""
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_DIR / name, out / name)
    if family := spec.get("tokenizer"):
        path = out / "tokenizer.json"
        tokenizer = json.loads(path.read_text())
        tokenizer.update(TOKENIZER_PIPELINES[family])
        path.write_text(json.dumps(tokenizer, ensure_ascii=False))


def config_for(spec):
    """config.json for a fixture: the spec's "config" over a tiny base of its model_type."""
    model_type = spec.get("model_type", "llama")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": 49152,  # the SmolLM2 tokenizer's
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if model_type == "gemma3n":
        text = {**GEMMA3N_TEXT, **spec.get("config", {})}
        return {
            "architectures": ["Gemma3nForConditionalGeneration"],
            "model_type": "gemma3n",
            "text_config": text,
            "vision_config": {"hidden_size": 16},
            "audio_config": {"hidden_size": 16},
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
    config["model_type"] = model_type
    config.update(FAMILY_BASE[model_type])
    config.update(spec.get("config", {}))
    if outer := spec.get("wrap"):
        return wrap(config, outer, spec.get("towers"))
    return config


# Multimodal checkpoints whose language model mlx-lm runs alone (the spec's "wrap": the outer
# model_type), with the tower tensors Hugging Face stores beside it, which both sides drop.
WRAPPERS = {
    "gemma4": ("Gemma4ForConditionalGeneration", ["vision_tower", "embed_vision", "audio_tower"]),
    # Without a vision_config (a mistral3 with one is a vision model: make_vision_fixtures.py).
    "mistral3": ("Mistral3ForConditionalGeneration", []),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", ["visual"]),
    "kimi_k25": ("KimiK25ForConditionalGeneration", ["vision_tower", "mm_projector"]),
    "llama4": ("Llama4ForConditionalGeneration", ["vision_model", "multi_modal_projector"]),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", ["visual"]),
}


def wrap(config, outer, towers=None):
    """The family's tiny text config under `text_config` of a multimodal config.json (Gemma 4
    also repeats the vocabulary at the top, which mlx-lm writes over the text config's), with a
    `vision_config` where it has towers (the wrapper's, or the spec's "towers")."""
    arch, _ = WRAPPERS[outer]
    towers = WRAPPERS[outer][1] if towers is None else towers
    wrapped = {
        "architectures": [arch],
        "model_type": outer,
        "text_config": config,
        "tie_word_embeddings": config["tie_word_embeddings"],
    }
    if towers:
        wrapped["vision_config"] = {"hidden_size": 16}
    if outer == "gemma4":
        wrapped["vocab_size"] = config["vocab_size"]
    return wrapped


def hf_multimodal(weights, outer, towers=None):
    """A wrapped model's tensors as transformers 5 saves them: the language model under
    `model.language_model.`, the head at the top, fused experts (`experts.gate_up_proj`, gate rows
    then up rows, and `experts.down_proj`), and a small tensor per tower."""
    out = {}
    for key, value in weights.items():
        if key.startswith("language_model.model."):
            key = "model.language_model." + key.removeprefix("language_model.model.")
        elif key.startswith("language_model."):
            key = key.removeprefix("language_model.")
        out[key] = value
    for key in [k for k in out if k.endswith(("switch_mlp.gate_proj.weight", "switch_glu.gate_proj.weight"))]:
        experts = key.rsplit(".", 3)[0]
        up = out.pop(key.replace("gate_proj", "up_proj"))
        parent = experts.removesuffix(".switch_mlp").removesuffix(".switch_glu")
        parent = parent if parent.endswith(".experts") else parent + ".experts"
        out[f"{parent}.gate_up_proj"] = mx.concatenate([out.pop(key), up], axis=-2)
        out[f"{parent}.down_proj"] = out.pop(key.replace("gate_proj", "down_proj"))
    for tower in WRAPPERS[outer][1] if towers is None else towers:
        out[f"model.{tower}.proj.weight"] = mx.random.normal((16, 16))
    return out


def write_adapter(model, adapter, out):
    """A LoRA or DoRA adapter ("fine_tune_type") as `mlx_lm.lora` saves one, over `model`
    (whose weights are already taken).

    mlx-lm's own `linear_to_lora_layers` wraps the layers; `lora_b` starts at zero there (an
    untrained adapter changes nothing), so it is drawn at random like `lora_a`; DoRA's magnitude
    `m` starts as the base rows' norms and is scaled at random per row. The adapter file is the
    trainable parameters, as training writes it.
    """
    kind = adapter.get("fine_tune_type", "lora")

    def trained(path, p):
        if path.endswith("lora_b"):
            return mx.random.uniform(-0.5, 0.5, p.shape)
        if path.endswith(".m"):
            return p * mx.random.uniform(0.5, 1.5, p.shape)
        return p

    params = {
        "rank": adapter.get("rank", 8),
        "scale": adapter.get("scale", 10.0),
        "dropout": 0.0,
        "keys": adapter["keys"],
    }
    num_layers = adapter.get("num_layers", -1)
    model.freeze()
    linear_to_lora_layers(model, num_layers, params, use_dora=kind == "dora")
    model.update(tree_map_with_path(trained, model.trainable_parameters()))
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    config = {"fine_tune_type": kind, "num_layers": num_layers, "lora_parameters": params}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))


def fused_columns(weights, stacked, outer):
    """Experts fused as Meta's Llama 4 and Qwen3-VL-MoE store them: `<p>.<stacked>.gate_proj`
    and `up_proj` as one `<p>.experts.gate_up_proj` `(experts, hidden, 2 * moe)` (gate columns,
    then up), `down_proj` as `<p>.experts.down_proj` `(experts, moe, hidden)`, the language
    model under `language_model.` (mlx-lm's names), and a tensor per tower; mlx-lm's sanitize
    splits, transposes and drops them."""
    out = {}
    gate, up, down = (f".{stacked}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj"))
    for key, value in weights.items():
        if key.endswith(gate):
            prefix = key[: -len(gate)]
            fused = mx.concatenate([value, weights[prefix + up]], axis=1)
            out[prefix + ".experts.gate_up_proj"] = fused.swapaxes(1, 2)
        elif key.endswith(down):
            out[key[: -len(down)] + ".experts.down_proj"] = value.swapaxes(1, 2)
        elif not key.endswith(up):
            out[key] = value
    for tower in WRAPPERS[outer][1]:
        out[f"{tower}.proj.weight"] = mx.random.normal((16, 16))
    return out


def unstack_experts(weights, names):
    """The stacked experts (`<moe>.switch_mlp.<proj>.<part>`, one row per expert) as Hugging
    Face stores them, one tensor per expert (`<moe>.experts.<e>.<name>.<part>`); `names` maps
    the projection to the Hugging Face name (Mixtral: gate_proj -> w1). mlx-lm's `sanitize`
    stacks them again at load."""
    out = {}
    for key, value in weights.items():
        moe, sep, rest = key.partition(".switch_mlp.")
        if not sep:
            out[key] = value
            continue
        proj, part = rest.split(".")
        for e in range(value.shape[0]):
            out[f"{moe}.experts.{e}.{names.get(proj, proj)}.{part}"] = value[e]
    return out


def granite_hf(weights):
    """Granite 4.0 hybrids as Hugging Face stores them: the experts' gate and up projections
    fused as `block_sparse_moe.input_linear` `(experts, 2 * moe, hidden)` (gate rows, then up),
    down as `output_linear`; a dense model's MLP as `shared_mlp.input_linear` / `output_linear`.
    mlx-lm's sanitize splits them again."""
    out = dict(weights)
    for key in [k for k in weights if k.endswith("switch_mlp.gate_proj.weight")]:
        moe = key.removesuffix(".switch_mlp.gate_proj.weight")
        up = out.pop(f"{moe}.switch_mlp.up_proj.weight")
        out[f"{moe}.input_linear.weight"] = mx.concatenate([out.pop(key), up], axis=1)
        out[f"{moe}.output_linear.weight"] = out.pop(f"{moe}.switch_mlp.down_proj.weight")
    for key in [k for k in weights if k.endswith(".mlp.gate_proj.weight")]:
        layer = key.removesuffix(".mlp.gate_proj.weight")
        up = out.pop(f"{layer}.mlp.up_proj.weight")
        out[f"{layer}.shared_mlp.input_linear.weight"] = mx.concatenate([out.pop(key), up], axis=0)
        out[f"{layer}.shared_mlp.output_linear.weight"] = out.pop(f"{layer}.mlp.down_proj.weight")
    return out


def interleave(a, b, axis):
    """Rows (or entries) of a and b alternating along `axis`: a[0], b[0], a[1], ..."""
    pairs = mx.stack([a, b], axis=axis + 1 if axis >= 0 else axis)
    shape = list(a.shape)
    shape[axis] *= 2
    return pairs.reshape(shape)


def hf_mla(weights):
    """Multi-head latent attention as Hugging Face stores it: one `kv_b_proj`
    `(heads * (nope + v), rank)`, which mlx-lm's sanitize splits into `embed_q` and `unembed_out`."""
    out = {}
    for name, w in weights.items():
        if name.endswith("self_attn.embed_q.weight"):
            prefix = name[: -len("embed_q.weight")]
            kv_b = mx.concatenate([w.swapaxes(-1, -2), weights[prefix + "unembed_out.weight"]], axis=1)
            out[prefix + "kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
        elif not name.endswith("self_attn.unembed_out.weight"):
            out[name] = w
    return out


def openai_experts(model, config):
    """GPT-OSS as OpenAI released it: the experts MXFP4 (everything else as it is), stored as
    `gate_up_proj` with gate and up rows alternating, packed as `_blocks` bytes (16 per group of
    32) with `_scales`, biases as `_bias`; config.json's `quantization_config` says mxfp4.
    mlx-lm's `sanitize` and loader undo it."""
    nn.quantize(model, group_size=32, bits=4, mode="mxfp4", class_predicate=lambda p, m: ".experts." in p and hasattr(m, "to_quantized"))
    config["quantization_config"] = {"quant_method": "mxfp4"}
    out = {}
    blocks = lambda w: w.view(mx.uint8).reshape(*w.shape[:-1], -1, 16)
    for key, value in tree_flatten(model.parameters()):
        prefix, sep, rest = key.partition(".experts.")
        if not sep:
            out[key] = value
            continue
        proj, part = rest.split(".")
        if proj == "up_proj":
            continue
        if proj == "gate_proj":
            up = dict(tree_flatten(model.parameters()))[f"{prefix}.experts.up_proj.{part}"]
            value = interleave(value, up, -1 if part == "bias" else -2)
            proj = "gate_up_proj"
        name = f"{prefix}.experts.{proj}"
        if part == "weight":
            out[f"{name}_blocks"] = blocks(value)
        elif part == "scales":
            out[f"{name}_scales"] = value
        else:
            out[f"{name}_bias"] = value
    return out


def mtp_drafter(config, layers):
    """mlx-vlm's drafter (`qwen3_5_mtp`) for a Qwen3.5 text config, `layers` deep."""
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import Model, ModelConfig

    text = dict(config, mtp_num_hidden_layers=layers)
    rotary = int(text["head_dim"] * text["rope_parameters"]["partial_rotary_factor"]) // 2
    # mlx-vlm's config wants an M-RoPE split; text positions are one row repeated, so any will do.
    sections = [rotary - 2 * (rotary // 3), rotary // 3, rotary // 3]
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=sections)
    return Model(ModelConfig.from_dict({"text_config": text}))


def scale_layers(drafter, scale):
    """A drafter's `layers.*` matrices (not its norms) scaled as the model's blocks are, so that
    its guesses vary."""
    drafter.update(
        tree_map_with_path(
            lambda path, p: p * scale if path.startswith("layers.") and "norm" not in path else p,
            drafter.parameters(),
        )
    )


def mtp_head(config, layers, seed, scale, hf_norms):
    """A multi-token-prediction head of `layers` layers for a Qwen3.5 text config, made with
    mlx-vlm's own drafter class, its layers scaled as the model's blocks, named as Qwen3.5's
    releases store it (`mtp.*`; norms as offsets from 1 where the model's are)."""
    mx.random.seed(seed)
    head = mtp_drafter(config, layers)
    scale_layers(head, scale)
    weights = {}
    for name, value in tree_flatten(head.parameters()):
        if hf_norms and "norm" in name.split(".")[-2]:
            value = value - 1.0
        weights[f"mtp.{name}"] = value
    return weights


def mtp_reference(model, head, prompt, chain):
    """What mlx-vlm's drafter `head` (loaded as mlx-vlm loads a checkpoint's `mtp.*`) guesses
    over `prompt` beside mlx-lm's model: the model's greedy
    next token (the first taken), the head's guess at every position of the prompt shifted by
    one with that token (`prefill_from_target_hidden`'s pass; the last is the seed), then `chain`
    guesses chained on its own hidden states (`draft_block`, greedy). The worker's head must
    guess the same (`models/decoder/mtp.rs`'s test)."""
    ids = mx.array([prompt])
    hidden = model.language_model.model(ids)
    first = int(mx.argmax(model.language_model.lm_head(hidden)[0, -1]).item())
    head.reset(model)
    shifted = mx.concatenate([ids[:, 1:], mx.array([[first]])], axis=1)
    out = head._forward_tokens(shifted, hidden, mx.int32)
    guesses = mx.argmax(head._lm_head_fn(out), axis=-1)[0].tolist()
    head._set_seed_from_hidden(out[:, -1:, :], None, True)
    block = head.draft_block(first, hidden[:, -1:, :], None, chain + 2, None, mx.int32, True)
    return {"prompt": prompt, "first": first, "guesses": guesses, "chained": block[0, 1:].tolist()}


def dflash_drafter(config, spec, kind="dflash"):
    """mlx-vlm's block drafter of `kind` for a target config (`qwen3_dflash`'s
    `DFlashDraftModel`; `dflash2`'s, with its causal convolutions and candidate selector;
    `dspark`'s, with its Markov head): `spec["layers"]` layers of 4 heads of 16 (2 key/value
    heads) over the target's hidden size and vocabulary, reading the target's layers
    `spec["target_layer_ids"]`; the last token of the vocabulary is its mask."""
    from mlx_vlm.speculative.drafters.dflash2 import DFlash2DraftModel
    from mlx_vlm.speculative.drafters.dflash2.config import DFlash2Config
    from mlx_vlm.speculative.drafters.dspark import DSparkDraftModel
    from mlx_vlm.speculative.drafters.dspark.config import DSparkConfig
    from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel
    from mlx_vlm.speculative.drafters.qwen3_dflash.config import DFlashConfig

    fields = dflash_config(config, spec)
    if kind == "dflash2":
        return DFlash2DraftModel(DFlash2Config(**fields, **DFLASH2_FIELDS))
    if kind == "dspark":
        return DSparkDraftModel(DSparkConfig(**fields, **DSPARK_FIELDS, proposal_length=spec["block_size"] - 1))
    return DFlashDraftModel(DFlashConfig(**fields))


# DFlash2's convolutions (kernel 3 over groups of 16 features), its selector (8 candidates, rank 8)
# and its input and output scales; DSpark's Markov head (rank 16), drafting from the anchor.
DFLASH2_FIELDS = {
    "conv_kernel_size": 3,
    "conv_group_size": 16,
    "selector_rank": 8,
    "selector_top_k": 8,
    "input_embedding_scale": 1.5,
    "output_multiplier": 0.75,
}
DSPARK_FIELDS = {"markov_rank": 16, "sample_from_anchor": True}


def drafter_layers(config, spec):
    """A companion drafter's layers: `spec["layers"]` of the target's width and vocabulary, 4
    heads of 16 (2 key/value heads)."""
    return {
        "hidden_size": config["hidden_size"],
        "intermediate_size": 128,
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": config["vocab_size"],
        "max_position_embeddings": config["max_position_embeddings"],
        "rope_theta": 1000000.0,
    }


def dflash_config(config, spec):
    """The drafter's fields, flat, as mlx-vlm's `DFlashConfig` takes them."""
    return {
        **drafter_layers(config, spec),
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "block_size": spec["block_size"],
        "mask_token_id": config["vocab_size"] - 1,
        "target_layer_ids": list(spec["target_layer_ids"]),
        "num_target_layers": config["num_hidden_layers"],
    }


def write_dflash(config, spec, seed, scale, out, kind="dflash"):
    """A block drafter of `kind` for the model, shipped as its releases ship one: its own
    directory (`out`) with config.json (a `qwen3` model type, the drafter's fields under
    `dflash_config`; DFlash2 and DSpark named by `architectures`, DSpark's block counting its
    proposals only) and model.safetensors named as its module tree, without embedding or lm_head
    (it binds to the target's). Made with mlx-vlm's class from its own seed, its layers'
    matrices scaled as the model's blocks (not its norms), so that its guesses vary; DFlash2's
    base kernels (zeros in the class) drawn too, so that every term of its convolution counts."""
    mx.random.seed(seed)
    drafter = dflash_drafter(config, spec, kind)
    scale_layers(drafter, scale)
    if kind == "dflash2":
        drafter.update(
            tree_map_with_path(
                lambda path, p: mx.random.normal(p.shape) * 0.5 if path.endswith("base_kernel") else p,
                drafter.parameters(),
            )
        )
    fields = dflash_config(config, spec)
    inner = {"mask_token_id": fields["mask_token_id"], "target_layer_ids": fields["target_layer_ids"]}
    architectures = ["DFlashDraftModel"]
    if kind == "dflash2":
        architectures = ["DFlash2DraftModel"]
        inner.update(DFLASH2_FIELDS)
    if kind == "dspark":
        architectures = ["Qwen3DSparkModel"]
        inner.update(DSPARK_FIELDS, projector_type="dspark", block_size=spec["block_size"] - 1)
        del fields["block_size"]
    released = {
        "architectures": architectures,
        "model_type": "qwen3",
        "hidden_act": "silu",
        "attention_bias": False,
        **{k: v for k, v in fields.items() if k not in ("mask_token_id", "target_layer_ids")},
        "dflash_config": inner,
        "torch_dtype": "float32",
    }
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(drafter.parameters())), metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(released, indent=2))


def eagle3_config(config, spec):
    """An EAGLE-3 drafter's config.json in the speculators format mlx-vlm reads (Red Hat's
    releases): one Llama layer of the target's width over its vocabulary
    (`transformer_layer_config`), a draft vocabulary of `spec["draft_vocab"]` tokens mapped into
    the target's by `d2t`, the target's layers `spec["aux_layers"]` as its context."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"model_type": "llama", **drafter_layers(config, spec)},
        "draft_vocab_size": spec["draft_vocab"],
        "target_hidden_size": config["hidden_size"],
        "norm_before_residual": True,
        "eagle_aux_hidden_state_layer_ids": list(spec["aux_layers"]),
        "speculators_config": {"proposal_methods": [{"speculative_tokens": spec["block_size"] - 2}]},
        "torch_dtype": "float32",
    }


def write_eagle3(config, spec, seed, scale, out):
    """An EAGLE-3 drafter for the model, made with mlx-vlm's `Eagle3DraftModel` from its own
    seed and saved as the speculators releases are: config.json (`eagle3_config`) and
    model.safetensors named as its module tree, with its own (random) embedding, which binds to
    the target's where the shapes agree, and `d2t`, each draft token's offset to its target
    token (a sorted random subset of the target's vocabulary)."""
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel, ModelConfig

    mx.random.seed(seed)
    released = eagle3_config(config, spec)
    drafter = Eagle3DraftModel(ModelConfig.from_dict(released))
    scale_layers(drafter, scale)
    rng = np.random.default_rng(seed)
    targets = np.sort(rng.choice(config["vocab_size"], spec["draft_vocab"], replace=False))
    drafter.d2t = mx.array(targets - np.arange(spec["draft_vocab"]), dtype=mx.int32)
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(drafter.parameters())), metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(released, indent=2))


def eagle3_reference(model, drafter, prompt, block, accepted):
    """Two rounds of mlx-vlm's EAGLE-3 drafter (as mlx-vlm loads it) beside mlx-lm's model,
    greedy, as `_eagle3_rounds` runs them: the prompt through the model (its layers before the
    drafter's `target_layer_ids` captured, `capture_layer_ids`; `first`, its greedy token), the
    drafter prefilled over the prompt shifted by `first` (`prefill_from_target_hidden`), a block
    (`draft1`: the seed and its chained guesses), the model over `first` and the block
    (`target1`), then the drafter told that `accepted` guesses and the model's token after
    them were taken (`accept_verified_tokens`; forced, so that the path that re-runs accepted
    guesses is compared even though a random drafter agrees with nothing), and the next block
    (`draft2`). The worker's drafter must guess the same."""
    argmax = lambda logits: mx.argmax(logits, axis=-1)
    layer_ids = list(drafter.config.capture_layer_ids)
    cache = model.make_cache()
    logits, hidden = forward_capturing(model, mx.array([prompt]), cache, layer_ids)
    first = int(mx.argmax(logits[0, -1]).item())
    drafter.reset(model)
    drafter.prefill_from_target_hidden(mx.array([prompt]), hidden, first, None, mx.int32, greedy=True)
    draft1 = drafter.draft_block(first, hidden[:, -1:], None, block, None, mx.int32, greedy=True)
    logits, verified = forward_capturing(model, mx.concatenate([mx.array([[first]]), draft1], axis=1), cache, layer_ids)
    target1 = argmax(logits)[0].tolist()
    nxt = target1[accepted]
    drafter.accept_verified_tokens(verified, draft1, accepted, [nxt], None, mx.int32, greedy=True)
    draft2 = drafter.draft_block(nxt, verified[:, accepted : accepted + 1], None, block, None, mx.int32, greedy=True)
    draft1, draft2 = draft1[0].tolist(), draft2[0].tolist()
    assert len(set(draft1)) > 1 and len(set(draft2)) > 1, (draft1, draft2)
    return {
        "prompt": prompt,
        "first": first,
        "draft1": draft1,
        "target1": target1,
        "accepted": accepted,
        "draft2": draft2,
        "block_size": block,
        "capture_layer_ids": layer_ids,
    }


def forward_capturing(model, ids, cache, layer_ids):
    """mlx-lm's Qwen3.5 `model` over `ids` with `cache`: its logits and the outputs of its layers
    `layer_ids` (the residual stream after each, as mlx-vlm's `capture_layer_ids` takes them),
    concatenated on the last axis. The layers' class is patched for the pass only."""
    layers = model.language_model.model.layers
    wanted = {id(layers[i]): i for i in layer_ids}
    layer_class = type(layers[0])
    call = layer_class.__call__
    outputs = {}

    def capture(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        if id(self) in wanted:
            outputs[wanted[id(self)]] = out
        return out

    layer_class.__call__ = capture
    try:
        logits = model(ids, cache=cache)
    finally:
        layer_class.__call__ = call
    return logits, mx.concatenate([outputs[i] for i in layer_ids], axis=-1)


def dflash_reference(model, drafter, prompt, layer_ids, block):
    """Two rounds of mlx-vlm's DFlash drafter (as mlx-vlm loads it from its directory) beside
    mlx-lm's model, greedy, as `_dflash_rounds` runs them: the prompt through the model with a
    cache (the target layers' outputs captured; `first`, its greedy next token), a block of
    `block - 1` guesses from `first` and those hidden states (`draft1`), the model over `first`
    and the guesses (`target1`, its greedy token at each position; `accepted`, how many guesses
    it agrees with from the start), then the next block (`draft2`) from the token after the
    accepted ones and the hidden states of `first` and the accepted guesses, on the drafter's
    same cache. The worker's drafter must guess the same."""
    argmax = lambda logits: mx.argmax(logits, axis=-1)
    cache = model.make_cache()
    logits, hidden = forward_capturing(model, mx.array([prompt]), cache, layer_ids)
    first = int(mx.argmax(logits[0, -1]).item())
    # DFlash2 and DSpark bind only to a model that says it rolls back its caches (mlx-vlm's);
    # these two rounds never roll back, so mlx-lm's model says so for them.
    lm = model.language_model
    if not hasattr(lm, "rollback_speculative_cache"):
        lm.rollback_speculative_cache = lambda *args: None
    drafter.bind(model)
    dcache = drafter.make_cache()
    draft1 = drafter.draft_block(first, hidden, dcache, block, argmax)[0].tolist()
    logits, hidden = forward_capturing(model, mx.array([[first] + draft1]), cache, layer_ids)
    target1 = argmax(logits)[0].tolist()
    accepted = 0
    while accepted < len(draft1) and draft1[accepted] == target1[accepted]:
        accepted += 1
    hidden2 = hidden[:, : accepted + 1]
    draft2 = drafter.draft_block(target1[accepted], hidden2, dcache, block, argmax)[0].tolist()
    # Guesses all alike would not test the drafter's positions.
    assert len(set(draft1)) > 1 and len(set(draft2)) > 1, (draft1, draft2)
    return {
        "prompt": prompt,
        "first": first,
        "draft1": draft1,
        "target1": target1,
        "accepted": accepted,
        "draft2": draft2,
        "block_size": block,
        "target_layer_ids": list(layer_ids),
    }


def build(spec, out):
    config = config_for(spec)
    mx.random.seed(spec.get("seed", 0))
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))

    # With mlx's default init the blocks add little to the residual stream, and greedy decoding
    # repeats one token forever. Scaling the blocks' matrices (not their norms) makes the
    # attention and MLP matter, so the generated tokens vary and test them.
    # Parameters named in "unscaled" keep their init (qwen3_next's decay rates `A_log` and
    # `dt_bias`: scaled, every step would forget the recurrent state almost entirely).
    scale = spec.get("block_scale", 4.0)
    unscaled = ["norm"] + spec.get("unscaled", [])
    # A wrapped model's language model is under `language_model.`.
    layers = "language_model.model.layers." if spec.get("wrap") else "model.layers."
    # Nemotron-H keeps its model under `backbone`; Gemma 3n under `model.language_model`.
    for prefix in ["backbone.layers.", "model.language_model.layers."]:
        if any(k.startswith(prefix) for k, _ in tree_flatten(model.parameters())):
            layers = prefix
    model.update(
        tree_map_with_path(
            lambda path, p: p * scale
            if path.startswith(layers) and not any(u in path for u in unscaled)
            else p,
            model.parameters(),
        )
    )

    # Attention sinks (GPT-OSS) and the parameters named in "drawn" (GLM-4-MoE's router
    # correction bias) start at zero: drawn at random so that they count.
    drawn = [".sinks"] + spec.get("drawn", [])
    model.update(
        tree_map_with_path(
            lambda path, p: mx.random.normal(p.shape) if any(path.endswith(d) for d in drawn) else p,
            model.parameters(),
        )
    )

    dtype = spec.get("dtype", "float32")
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    config["torch_dtype"] = dtype

    if q := spec.get("quantize"):
        # As `mlx_lm.convert -q` does: affine quantization of every layer that supports it,
        # recorded in config.json for `mlx_lm.load`.
        # Per-layer overrides ({path: {group_size, bits}} or {path: false}) are recorded under
        # their path in `quantization`, which is where mlx_lm.load looks for them.
        # A model's own `quant_predicate` (Qwen3-MoE: the router at 8 bits) applies as
        # `mlx_lm.convert` applies it, its per-layer answers recorded the same way.
        overrides = dict(q.get("overrides", {}))
        model_predicate = getattr(model, "quant_predicate", None)

        def predicate(path, module):
            if not hasattr(module, "to_quantized"):
                return False
            # mlx_lm.convert leaves float what does not split into groups (Mamba's `dt_proj`).
            if module.weight.shape[-1] % q["group_size"] != 0:
                return False
            if path not in overrides and model_predicate is not None:
                params = model_predicate(path, module)
                if isinstance(params, dict):
                    overrides[path] = params
            return overrides.get(path, True)

        mode = q.get("mode", "affine")
        nn.quantize(model, group_size=q["group_size"], bits=q["bits"], mode=mode, class_predicate=predicate)
        config["quantization"] = {"group_size": q["group_size"], "bits": q["bits"], "mode": mode}
        config["quantization"].update(overrides)
        config["quantization_config"] = config["quantization"]

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    if adapter := spec.get("adapter"):
        write_adapter(model, adapter, tmp / "adapter")
    if spec.get("openai_experts"):
        weights = openai_experts(model, config)
    if stacked := spec.get("fused_columns"):
        weights = fused_columns(weights, stacked, spec["wrap"])
    elif spec.get("wrap") and not spec.get("quantize"):
        weights = hf_multimodal(weights, spec["wrap"], spec.get("towers"))
    # Gemma 3n's towers as Hugging Face ships them beside the language model (both sides drop
    # them).
    for tower in spec.get("towers", []) if config["model_type"] == "gemma3n" else []:
        weights[f"model.{tower}.proj.weight"] = mx.random.normal((16, 16))
    if spec.get("hf_mla"):
        weights = hf_mla(weights)
    if spec.get("granite_hf"):
        weights = granite_hf(weights)
    if (names := spec.get("hf_experts")) is not None:
        weights = unstack_experts(weights, names)
    # Parts Hugging Face names otherwise than the reference's modules (LFM2-MoE's dense
    # `feed_forward.w1`, which mlx-lm's sanitize renames `gate_proj`).
    for ours, theirs in spec.get("hf_names", {}).items():
        weights = {k.replace(ours, theirs): v for k, v in weights.items()}
    # Convolutions as Hugging Face stores them, `(channels, 1, kernel)` (Qwen3.5: mlx-lm then
    # also shifts the norms; LFM2's `conv.conv`).
    if spec.get("hf_conv1d"):
        conv = ("conv1d.weight", "conv.conv.weight")
        weights = {k: v.swapaxes(1, 2) if k.endswith(conv) else v for k, v in weights.items()}
    # The checkpoint's own multi-token-prediction head, which mlx-lm drops and the worker drafts
    # with.
    if layers := spec.get("mtp"):
        config["mtp_num_hidden_layers"] = layers
        weights.update(mtp_head(config, layers, spec.get("seed", 0) + 1000, scale, spec.get("hf_conv1d")))
    # e.g. Gemma 3's lm_head: without it mlx-lm ties the head to the embedding.
    for name in spec.get("drop_tensors", []):
        del weights[name]

    if (gguf_spec := spec.get("gguf")) is not None:
        from gguf_fixture import exact_in_gguf

        weights = exact_in_gguf(weights, gguf_spec)

    shards = spec.get("shards", 1)
    if shards == 1:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    else:
        # Sharded as Hugging Face writes it: model-0000i-of-0000n.safetensors plus an index.
        names = sorted(weights)
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: weights[n] for n in names[i::shards]}
            mx.save_safetensors(str(tmp / file), part, metadata={"format": "mlx"})
            weight_map.update({n: file for n in part})
        index = {"metadata": {}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(spec, tmp)
    # The same checkpoint as a float32 GGUF (`<name>.gguf`), which the worker's side imports.
    if gguf_spec is not None:
        from gguf_fixture import write_gguf

        write_gguf(config, weights, tmp, out.name, gguf_spec)
    if spec.get("mtp"):
        # Beside the model as mlx-lm loads it from the files (its sanitize shifts norms).
        from mlx_lm.utils import load_model

        loaded, _ = load_model(tmp)
        head = mtp_drafter(config, spec["mtp"])
        stored = {k: v for k, v in weights.items() if k.startswith("mtp.")}
        head.load_weights(list(head.sanitize(stored).items()))
        reference = mtp_reference(loaded, head, list(range(100, 140)), 3)
        (tmp / "mtp_reference.json").write_text(json.dumps(reference))
    for kind, offset in (("dflash", 2024), ("dflash2", 2030), ("dspark", 2040)):
        if not (dflash := spec.get(kind)):
            continue
        # A companion block drafter in its own directory, and what mlx-vlm drafts with it (as
        # mlx-vlm loads it) beside the model as mlx-lm loads it from the files.
        from mlx_lm.utils import load_model
        from mlx_vlm.utils import load_model as load_vlm_model

        # Its own seed, after the model's: for DFlash the first offset from 2000 whose drafter
        # guesses a different token at every position of both reference blocks (many repeat one).
        write_dflash(config, dflash, spec.get("seed", 0) + offset, scale, tmp / kind, kind)
        loaded, _ = load_model(tmp)
        drafter = load_vlm_model(tmp / kind)
        reference = dflash_reference(
            loaded, drafter, list(range(100, 140)), dflash["target_layer_ids"], dflash["block_size"]
        )
        (tmp / f"{kind}_reference.json").write_text(json.dumps(reference))
    if eagle3 := spec.get("eagle3"):
        # An EAGLE-3 companion in its own directory and what mlx-vlm drafts with it.
        from mlx_lm.utils import load_model
        from mlx_vlm.utils import load_model as load_vlm_model

        write_eagle3(config, eagle3, spec.get("seed", 0) + 2050, scale, tmp / "eagle3")
        loaded, _ = load_model(tmp)
        drafter = load_vlm_model(tmp / "eagle3")
        reference = eagle3_reference(loaded, drafter, list(range(100, 140)), eagle3["block_size"], 2)
        (tmp / "eagle3_reference.json").write_text(json.dumps(reference))
    (tmp / "spec.json").write_text(json.dumps(spec, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


if __name__ == "__main__":
    cases_path, TOKENIZER_DIR, out_root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    cases = json.loads(Path(cases_path).read_text())
    for model in cases["models"]:
        spec = model.get("fixture")
        if spec is None:
            continue
        out = out_root / model["name"]
        spec_file = out / "spec.json"
        if spec_file.is_file() and spec_file.read_text() == json.dumps(spec, sort_keys=True):
            continue
        print(f"making fixture {model['name']} in {out}", file=sys.stderr)
        build(spec, out)
