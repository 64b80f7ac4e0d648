"""DiffusionGemma's `text_config.rope_parameters` (one entry per layer type) -> the RoPE fields
of `ModelConfig`: sliding layers' theta (default RoPE over the whole head), full-attention
layers' theta and turning pairs (proportional RoPE, transformers' "proportional": the first
int(partial_rotary_factor * D // 2) of the D/2 pairs turn, the rest stay)."""

from __future__ import annotations

from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import FULL, SLIDING

DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
}


def rope_fields(t: dict[str, Any], types: tuple[str, ...], head_dim: int,
                global_head_dim: int) -> dict[str, Any]:
    """rope_theta, global_rope_theta, global_rope_pairs (None: every pair turns).

    Raises:
        ConfigError: rope_parameters without an entry for a layer type in use, without its
            rope_theta, of a type other than "default" (both kinds) or "proportional" (full
            layers), a partial "default" RoPE (the reference cannot run it) or a
            proportional `factor` other than 1.
    """
    params = t.get("rope_parameters")
    if params is None:
        params = DEFAULT_ROPE
    elif not isinstance(params, dict):
        raise f.bad("text_config.rope_parameters", params, "must map layer types to RoPE")
    out: dict[str, Any] = {"rope_theta": DEFAULT_ROPE[SLIDING]["rope_theta"]}
    for kind in sorted(set(types)):
        key = f"text_config.rope_parameters.{kind}"
        p = params.get(kind)
        if not isinstance(p, dict):
            raise ConfigError(f"config.json lacks {key} (layer_types use {kind})")
        theta = f.as_float(f"{key}.rope_theta", p.get("rope_theta"))
        rope_type = p.get("rope_type", "default")
        factor = p.get("partial_rotary_factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                or not 0 <= factor <= 1:
            raise f.bad(f"{key}.partial_rotary_factor", factor, "must be a number in [0, 1]")
        d = head_dim if kind == SLIDING else global_head_dim
        if rope_type == "default":
            if factor != 1:
                raise f.bad(f"{key}.partial_rotary_factor", factor,
                            "with rope_type 'default' is not supported (only 1)")
            pairs = None
        elif rope_type == "proportional" and kind == FULL:
            if p.get("factor", 1.0) != 1:
                raise f.bad(f"{key}.factor", p["factor"], "is not supported (only 1)")
            pairs = int(factor * d // 2)
        else:
            raise f.bad(f"{key}.rope_type", rope_type, "is not supported ('default', and "
                                                       "'proportional' on full layers)")
        if kind == SLIDING:
            out["rope_theta"] = theta
        else:
            out.update(global_rope_theta=theta, global_rope_pairs=pairs)
    return out
