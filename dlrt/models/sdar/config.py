"""SDAR's `config.json` (Qwen3 / Qwen3-MoE names) -> `ModelConfig`."""

from __future__ import annotations

from typing import Any

from dlrt.config import hf as f
from dlrt.config.model import ModelConfig
from dlrt.errors import ConfigError


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
    vocab = f.as_int("vocab_size", f.required(hf, "vocab_size"))
    hidden = f.as_int("hidden_size", f.required(hf, "hidden_size"))
    heads = f.as_int("num_attention_heads", f.required(hf, "num_attention_heads"))
    num_layers = f.as_int("num_hidden_layers", f.required(hf, "num_hidden_layers"))
    moe = _moe(hf, num_layers) if family == "sdar_moe" else {}
    block_size = hf.get("block_size")
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=f.as_int("intermediate_size", f.required(hf, "intermediate_size")),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=f.kv_heads(hf, "num_key_value_heads", heads),
        head_dim=f.as_int("head_dim", f.optional(hf, "head_dim", hidden // heads)),
        rms_norm_eps=f.as_float("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)),
        rope_theta=f.as_float("rope_theta", hf.get("rope_theta", 10000.0)),
        max_position_embeddings=f.as_int("max_position_embeddings",
                                         hf.get("max_position_embeddings", 32768)),
        tie_word_embeddings=f.as_bool("tie_word_embeddings",
                                      hf.get("tie_word_embeddings", False)),
        initializer_range=f.as_float("initializer_range", hf.get("initializer_range", 0.02)),
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


def with_layers(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A copy of the config keeping only the first `num_layers` layers."""
    out = dict(hf, num_hidden_layers=num_layers)
    if out.get("max_window_layers"):
        out["max_window_layers"] = num_layers
    return out
