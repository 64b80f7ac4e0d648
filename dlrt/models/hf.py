"""Typed readers of raw `config.json` fields for the families' normalisers: each bad value is
a `ConfigError` that names the field and the value."""

from __future__ import annotations

import math
from typing import Any

from dlrt.errors import ConfigError


def required(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return hf[key]


def optional(hf: dict[str, Any], key: str, default: Any) -> Any:
    """hf[key], or `default` when the field is absent or null."""
    return default if hf.get(key) is None else hf[key]


def bad(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"config.json: {key}={value!r} {why}")


def as_int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad(key, value, f"must be an integer >= {minimum}")
    return value


def as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < math.inf:
        raise bad(key, value, "must be a finite number > 0")
    return float(value)


def as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(key, value, "must be true or false")
    return value


def token_id(key: str, value: Any, vocab_size: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value < vocab_size):
        raise bad(key, value, f"must be a token id in [0, {vocab_size})")
    return value


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    return tuple(as_int("eos_token_id", v, minimum=0) for v in ids)


def kv_heads(hf: dict[str, Any], key: str, heads: int) -> int:
    kv = as_int(key, optional(hf, key, heads))
    if heads % kv:
        raise bad(key, kv, f"must divide the number of attention heads ({heads})")
    return kv


def activation(key: str, value: Any) -> None:
    if value != "silu":
        raise bad(key, value, "is not supported (only silu)")


def qwen_sizes(hf: dict[str, Any], eps: float, max_positions: int) -> dict[str, Any]:
    """The `ModelConfig` fields that configs with Qwen / Llama names (SDAR, LLaDA2) share:
    sizes, norm epsilon, RoPE theta, positions, tying and init range; `eps` and
    `max_positions` are the family's defaults when the config has none."""
    hidden = as_int("hidden_size", required(hf, "hidden_size"))
    heads = as_int("num_attention_heads", required(hf, "num_attention_heads"))
    return dict(
        vocab_size=as_int("vocab_size", required(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=as_int("intermediate_size", required(hf, "intermediate_size")),
        num_layers=as_int("num_hidden_layers", required(hf, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=kv_heads(hf, "num_key_value_heads", heads),
        head_dim=as_int("head_dim", optional(hf, "head_dim", hidden // heads)),
        rms_norm_eps=as_float("rms_norm_eps", hf.get("rms_norm_eps", eps)),
        rope_theta=as_float("rope_theta", hf.get("rope_theta", 10000.0)),
        max_position_embeddings=as_int("max_position_embeddings",
                                       hf.get("max_position_embeddings", max_positions)),
        tie_word_embeddings=as_bool("tie_word_embeddings", hf.get("tie_word_embeddings", False)),
        initializer_range=as_float("initializer_range", hf.get("initializer_range", 0.02)),
    )


def with_layers(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A copy of a Qwen-named config keeping only its first `num_layers` layers."""
    out = dict(hf, num_hidden_layers=num_layers)
    if out.get("max_window_layers"):
        out["max_window_layers"] = num_layers
    return out
