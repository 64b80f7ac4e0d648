"""LLaDA-MoE's `config.json` (the remote code's `LLaDAMoEConfig` names) -> `ModelConfig`."""

from __future__ import annotations

from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import ModelConfig


def llada_moe_config(hf: dict[str, Any], family: str = "llada_moe") -> ModelConfig:
    """Normalise a LLaDA-MoE config (OLMoE layout: q/k norms, RoPE, softmax top-k experts).

    `norm_topk_prob` and `routed_scaling_factor` are read by nothing: the official MoE block
    never renormalises or scales the top-k softmax weights, so `norm_topk_prob` is False here
    whatever the file says. `moe_layer_freq` [L] marks each layer MoE (1) or dense (0: a SwiGLU
    of `dense_intermediate_size`).

    Raises:
        ConfigError: a missing required field, a field of the wrong type or out of range (the
            message names it and its value), or an unsupported feature (rope scaling, partial
            RoPE, attention bias, clip_qkv, no q/k norm, a shared expert, an expert bias, a
            router other than softmax, an activation not silu).
    """
    if hf.get("rope_scaling"):
        raise ConfigError(f"LLaDA-MoE rope_scaling {hf['rope_scaling']!r} is not supported")
    if f.optional(hf, "partial_rotary_factor", 1.0) != 1.0:
        raise f.bad("partial_rotary_factor", hf["partial_rotary_factor"],
                    "is not supported (only 1.0)")
    if hf.get("attention_bias"):
        raise ConfigError("LLaDA-MoE attention_bias=true is not supported")
    if hf.get("clip_qkv") is not None:
        raise f.bad("clip_qkv", hf["clip_qkv"], "is not supported (only null)")
    if not f.as_bool("qk_layernorm", f.optional(hf, "qk_layernorm", True)):
        raise ConfigError("LLaDA-MoE qk_layernorm=false is not supported")
    if f.optional(hf, "shared_expert_intermediate_size", 0) not in (0, -1):
        raise f.bad("shared_expert_intermediate_size", hf["shared_expert_intermediate_size"],
                    "is not supported (only 0: no shared expert)")
    if hf.get("moe_router_enable_expert_bias"):
        raise ConfigError("LLaDA-MoE moe_router_enable_expert_bias=true is not supported")
    scoring = f.optional(hf, "moe_router_score_function", "softmax")
    if scoring != "softmax":
        raise f.bad("moe_router_score_function", scoring, "is not supported (only softmax)")
    f.activation("hidden_act", hf.get("hidden_act", "silu"))
    hidden = f.as_int("hidden_size", f.required(hf, "hidden_size"))
    heads = f.as_int("num_attention_heads", f.required(hf, "num_attention_heads"))
    if hidden % heads:
        raise f.bad("hidden_size", hidden, f"must be a multiple of num_attention_heads={heads}")
    layers = f.as_int("num_hidden_layers", f.required(hf, "num_hidden_layers"))
    experts = f.as_int("num_experts", f.required(hf, "num_experts"))
    top_k = f.as_int("num_experts_per_tok", f.required(hf, "num_experts_per_tok"))
    if top_k > experts:
        raise f.bad("num_experts_per_tok", top_k, f"exceeds num_experts={experts}")
    vocab = f.as_int("vocab_size", f.required(hf, "vocab_size"))
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=f.as_int("dense_intermediate_size",
                                   f.required(hf, "dense_intermediate_size")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=f.kv_heads(hf, "num_key_value_heads", heads),
        head_dim=hidden // heads,
        rms_norm_eps=f.as_float("rms_norm_eps", hf.get("rms_norm_eps", 1e-5)),
        rope_theta=f.as_float("rope_theta", f.required(hf, "rope_theta")),
        max_position_embeddings=f.as_int("max_position_embeddings",
                                         hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=f.as_bool("tie_word_embeddings", hf.get("tie_word_embeddings", False)),
        initializer_range=f.as_float("initializer_range", hf.get("initializer_range", 0.02)),
        mask_token_id=f.token_id("mask_token_id", hf.get("mask_token_id"), vocab),
        eos_token_ids=f.eos_ids(hf.get("eos_token_id")),
        block_size=None,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=f.as_int("expert_intermediate_size",
                                       f.required(hf, "expert_intermediate_size")),
        norm_topk_prob=False,
        moe_layers=_moe_layers(hf, layers),
    )


def _moe_layers(hf: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers whose `moe_layer_freq` entry is 1 (every layer when the field is absent)."""
    freq = f.optional(hf, "moe_layer_freq", [1] * num_layers)
    if not isinstance(freq, list) or len(freq) != num_layers \
            or any(v not in (0, 1) or isinstance(v, bool) for v in freq):
        raise f.bad("moe_layer_freq", freq, f"must be a list of {num_layers} 0/1 values "
                    "(num_hidden_layers)")
    return tuple(i for i, v in enumerate(freq) if v == 1)


def with_layers(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A copy of the config keeping only the first `num_layers` layers."""
    out = dict(hf, num_hidden_layers=num_layers)
    if isinstance(hf.get("moe_layer_freq"), list):
        out["moe_layer_freq"] = hf["moe_layer_freq"][:num_layers]
    return out
