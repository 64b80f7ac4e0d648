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
