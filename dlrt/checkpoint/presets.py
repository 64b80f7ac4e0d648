"""Built-in tiny configs and the real configs shipped with the package, by name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from dlrt.resources import data_path


def real_config(name: str) -> Path | None:
    """Folder of a shipped real config (`dlrt/data/configs`, e.g. 'SDAR-8B-Chat'), or None."""
    if not name or "/" in name:
        return None
    path = data_path("configs", name)
    return path if (path / "config.json").is_file() else None


def real_configs() -> list[str]:
    """Names of the shipped real configs, sorted."""
    root = data_path("configs")
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


_SDAR_GEN = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny-sdar": {
        "architectures": ["SDARForCausalLM"], "model_type": "sdar", "vocab_size": 151936,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, "initializer_range": 0.02, "block_size": 4,
        "mask_token_id": 151669, "bos_token_id": 151643, "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
    "tiny-sdar-moe": {
        "architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe",
        "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "initializer_range": 0.02, "mask_token_id": 151669, "bos_token_id": 151643,
        "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "tiny-llada": {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": 64,
        "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 128,
        "embedding_size": 126464, "vocab_size": 126464, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_sequence_length": 4096, "mask_token_id": 126336,
        "eos_token_id": 126081, "pad_token_id": 126081, "block_type": "llama",
        "layer_norm_type": "rms", "rope": True, "weight_tying": False, "init_std": 0.02,
        "torch_dtype": "bfloat16",
    },
    "tiny-llada2": {  # layer 0 dense, layers 1-2 MoE; RoPE on 16 of 32 head dims
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "vocab_size": 157184, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "n_group": 4, "topk_group": 2, "num_shared_experts": 1, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "norm_topk_prob": True, "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "partial_rotary_factor": 0.5, "rotary_dim": 16, "rope_theta": 600000,
        "rope_scaling": None, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
        "use_qk_norm": True, "use_qkv_bias": False, "use_bias": False, "hidden_act": "silu",
        "use_sliding_window": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "mask_token_id": 156895, "eos_token_id": 156892, "pad_token_id": 156892,
        "torch_dtype": "bfloat16",
    },
    "tiny-llada-moe": {  # layers 0 and 2 MoE (8 experts, top 4, not renormalised), 1 dense
        "architectures": ["LLaDAMoEModelLM"], "model_type": "lladamoe", "vocab_size": 157184,
        "hidden_size": 64, "dense_intermediate_size": 128, "expert_intermediate_size": 32,
        "shared_expert_intermediate_size": 0, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 50000,
        "partial_rotary_factor": 1.0, "rope_scaling": None, "attention_bias": False,
        "clip_qkv": None, "num_experts": 8, "num_experts_per_tok": 4, "norm_topk_prob": False,
        "qk_layernorm": True, "moe_layer_freq": [1, 0, 1],
        "moe_router_enable_expert_bias": False, "moe_router_score_function": "softmax",
        "routed_scaling_factor": 1, "tie_word_embeddings": False, "pad_token_id": 156892,
        "eos_token_id": 156892, "mask_token_id": 156895, "torch_dtype": "bfloat16",
    },
    # 4 layers (sliding, full, sliding, full), window 8, full layers with K = V and their own
    # head size (32) and KV heads (1), 4 experts top-2 beside the dense MLP, canvas 16; the
    # vocabulary and special ids of its tokenizer (PRESET_TOKENIZER)
    "tiny-diffusion-gemma": {
        "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
        "canvas_length": 16, "image_token_id": 1, "tie_word_embeddings": True,
        "text_config": {
            "model_type": "diffusion_gemma_text", "vocab_size": 8192, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_global_key_value_heads": 1, "head_dim": 16,
            "global_head_dim": 32, "attention_k_eq_v": True, "num_experts": 4,
            "top_k_experts": 2, "moe_intermediate_size": 32,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "sliding_window": 8,
            "final_logit_softcapping": 30.0,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "full_attention"],
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "tie_word_embeddings": True, "initializer_range": 0.02, "eos_token_id": [0],
            "pad_token_id": 2, "bos_token_id": 0, "attention_bias": False},
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16},
        "torch_dtype": "bfloat16",
    },
}
PRESET_GENERATION = {
    "tiny-sdar": _SDAR_GEN,
    "tiny-sdar-moe": _SDAR_GEN,
    "tiny-llada": {"eos_token_id": 126081, "pad_token_id": 126081},
    "tiny-llada2": {"eos_token_id": 156892, "pad_token_id": 156892},
    "tiny-llada-moe": {"eos_token_id": 156892, "pad_token_id": 156892},
    "tiny-diffusion-gemma": {"eos_token_id": [0], "pad_token_id": 2, "bos_token_id": 0},
}
# preset -> the folder under dlrt/data whose tokenizer its checkpoint gets (else the family's,
# `Family.tokenizer`): tiny-diffusion-gemma takes the embedded default model's (8192 ids:
# <|endoftext|> 0, the stop id; <|mask|> 1, which stands for the image placeholder here, as
# a renoising model has no mask token; <|pad|> 2), its vocabulary and ids sized to it
PRESET_TOKENIZER = {"tiny-diffusion-gemma": "sdar-stdlib-8m"}


def preset(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, generation_config) of a built-in preset (copies)."""
    return copy.deepcopy(PRESETS[name]), copy.deepcopy(PRESET_GENERATION[name])


def preset_tokenizer(name: str) -> Path | None:
    """The folder whose tokenizer files preset `name`'s checkpoint gets (None: its family's)."""
    folder = PRESET_TOKENIZER.get(name)
    return None if folder is None else data_path(folder)
