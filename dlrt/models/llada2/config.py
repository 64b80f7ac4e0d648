"""LLaDA2's `config.json` (`LLaDA2MoeConfig` of inclusionAI/LLaDA2.0) -> `ModelConfig`.

Defaults for absent fields are `LLaDA2MoeConfig`'s (e.g. partial_rotary_factor 0.5, n_group 8,
topk_group 4, routed_scaling_factor 2.5, first_k_dense_replace 0, use_qk_norm true, use_bias
true: refused). The released configs name no mask or eos token: the tokenizer's `<|mask|>`
(156895) and `<|endoftext|>` (156892) are the defaults when they fit the vocabulary.
"""

from __future__ import annotations

from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import ModelConfig

MASK_TOKEN_ID = 156895
EOS_TOKEN_ID = 156892


def llada2_config(hf: dict[str, Any], family: str = "llada2") -> ModelConfig:
    """Normalise a LLaDA2 MoE config.

    Raises:
        ConfigError: a missing required field, a field of the wrong type or out of range (the
            message names it and its value), or an unsupported feature (rope scaling, a
            sliding window in use, q/k/v or output-projection bias, an activation not silu, a
            router other than sigmoid with expert bias).
    """
    _refuse_unsupported(hf)
    sizes = f.qwen_sizes(hf, eps=1e-5, max_positions=16384)
    vocab = sizes["vocab_size"]
    mask = f.optional(hf, "mask_token_id", MASK_TOKEN_ID if MASK_TOKEN_ID < vocab else None)
    eos = f.optional(hf, "eos_token_id", EOS_TOKEN_ID if EOS_TOKEN_ID < vocab else None)
    return ModelConfig(
        family=family,
        **sizes,
        mask_token_id=f.token_id("mask_token_id", mask, vocab),
        eos_token_ids=f.eos_ids(eos),
        block_size=None,
        rotary_dim=_rotary_dim(hf, sizes["head_dim"]),
        use_qk_norm=f.as_bool("use_qk_norm", hf.get("use_qk_norm", True)),
        **_moe(hf, sizes["num_layers"]),
    )


def _refuse_unsupported(hf: dict[str, Any]) -> None:
    if hf.get("rope_scaling"):
        raise ConfigError(f"rope_scaling {hf['rope_scaling']!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ConfigError("use_sliding_window=true is not supported")
    if hf.get("use_qkv_bias"):
        raise ConfigError("use_qkv_bias=true (a bias on query_key_value) is not supported")
    if hf.get("use_bias", True):
        raise ConfigError("use_bias=true (a bias on attention.dense; LLaDA2MoeConfig's default "
                          "when absent) is not supported")
    f.activation("hidden_act", hf.get("hidden_act", "silu"))
    if hf.get("score_function", "sigmoid") != "sigmoid":
        raise f.bad("score_function", hf["score_function"], "is not supported (only sigmoid)")
    if hf.get("moe_router_enable_expert_bias") is False:
        raise ConfigError("moe_router_enable_expert_bias=false is not supported")


def _rotary_dim(hf: dict[str, Any], head_dim: int) -> int:
    """int(head_dim * partial_rotary_factor), as the official attention; a `rotary_dim` field,
    when present, must agree."""
    factor = hf.get("partial_rotary_factor", 0.5)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise f.bad("partial_rotary_factor", factor, "must be a number in (0, 1]")
    rot = int(head_dim * factor)
    if rot < 2 or rot % 2:
        raise f.bad("partial_rotary_factor", factor,
                    f"gives {rot} rotary dims of head_dim={head_dim}: need an even number >= 2")
    if hf.get("rotary_dim") is not None and hf["rotary_dim"] != rot:
        raise f.bad("rotary_dim", hf["rotary_dim"],
                    f"disagrees with head_dim * partial_rotary_factor = {rot}")
    return rot


def _moe(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Router settings and which layers are sparse: those >= first_k_dense_replace, unless
    `num_experts` is null (then all are dense). A config without `num_experts` is refused:
    LLaDA2MoeConfig's default (16) fits no released model."""
    first_dense = f.as_int("first_k_dense_replace",
                           f.optional(hf, "first_k_dense_replace", 0), minimum=0)
    if "num_experts" in hf and hf["num_experts"] is None:
        return {}
    experts = f.as_int("num_experts", f.required(hf, "num_experts"))
    top_k = f.as_int("num_experts_per_tok", f.optional(hf, "num_experts_per_tok", 2))
    if top_k > experts:
        raise f.bad("num_experts_per_tok", top_k, f"exceeds num_experts={experts}")
    n_group = f.as_int("n_group", f.optional(hf, "n_group", 8))
    topk_group = f.as_int("topk_group", f.optional(hf, "topk_group", 4))
    if experts % n_group:
        raise f.bad("n_group", n_group, f"must divide num_experts={experts}")
    if topk_group > n_group:
        raise f.bad("topk_group", topk_group, f"exceeds n_group={n_group}")
    if top_k > topk_group * (experts // n_group):
        raise f.bad("num_experts_per_tok", top_k,
                    f"exceeds the {topk_group * (experts // n_group)} experts of the "
                    f"topk_group={topk_group} groups kept")
    return dict(
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=f.as_int("moe_intermediate_size",
                                       f.required(hf, "moe_intermediate_size")),
        # NOTE: the official router renormalises whenever top_k > 1, whatever norm_topk_prob.
        norm_topk_prob=True,
        moe_layers=tuple(range(first_dense, num_layers)),
        router_scoring="sigmoid",
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=f.as_float("routed_scaling_factor",
                                         hf.get("routed_scaling_factor", 2.5)),
        num_shared_experts=f.as_int("num_shared_experts",
                                    f.optional(hf, "num_shared_experts", 0), minimum=0),
    )
