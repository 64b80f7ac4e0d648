"""SDAR's `config.json` (Qwen3 / Qwen3-MoE names) -> `ModelConfig`."""

from __future__ import annotations

from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import ModelConfig


def sdar_config(hf: dict[str, Any], family: str) -> ModelConfig:
    """Normalise an SDAR dense (`family="sdar"`) or MoE (`"sdar_moe"`) config.

    Raises:
        ConfigError: a missing required field, a field of the wrong type or out of range (the
            message names it and its value), or an unsupported feature (rope scaling, sliding
            window, attention bias, an activation not silu).
    """
    if hf.get("rope_scaling"):
        raise ConfigError(f"rope_scaling {hf['rope_scaling']!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ConfigError("use_sliding_window=true is not supported")
    if hf.get("attention_bias"):
        raise ConfigError("attention_bias=true is not supported")
    f.activation("hidden_act", hf.get("hidden_act", "silu"))
    sizes = f.qwen_sizes(hf, eps=1e-6, max_positions=32768)
    moe = _moe(hf, sizes["num_layers"]) if family == "sdar_moe" else {}
    block_size = hf.get("block_size")
    vocab = sizes["vocab_size"]
    return ModelConfig(
        family=family,
        **sizes,
        mask_token_id=f.token_id("mask_token_id", hf.get("mask_token_id"), vocab),
        eos_token_ids=f.eos_ids(hf.get("eos_token_id")),
        block_size=None if block_size is None else f.as_int("block_size", block_size),
        **moe,
    )


def _moe(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Qwen3-MoE router settings and which layers are sparse."""
    step = f.as_int("decoder_sparse_step", f.optional(hf, "decoder_sparse_step", 1))
    dense = {f.as_int("mlp_only_layers", i, minimum=0) for i in hf.get("mlp_only_layers") or []}
    experts = f.as_int("num_experts", f.required(hf, "num_experts"))
    top_k = f.as_int("num_experts_per_tok", f.required(hf, "num_experts_per_tok"))
    if top_k > experts:
        raise f.bad("num_experts_per_tok", top_k, f"exceeds num_experts={experts}")
    return dict(
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=f.as_int("moe_intermediate_size",
                                       f.required(hf, "moe_intermediate_size")),
        norm_topk_prob=f.as_bool("norm_topk_prob", hf.get("norm_topk_prob", True)),
        moe_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0),
    )
