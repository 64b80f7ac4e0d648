"""The ops table: the small ops of a forward and a round, one implementation set chosen at load.

`reference` is plain PyTorch (the CPU path and every kernel's reference); `triton` runs dlrt's
Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1). Layers receive the table when they
are built and never choose for themselves; tests pick a table instead of patching modules.
Projections are not ops: each linear layer holds its own `LinearMethod` (`dlrt.layers.quant`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from dlrt.errors import OptionError

NAMES = ("reference", "triton")


@dataclass(frozen=True)
class Ops:
    """One implementation of each op; the signatures are those of `dlrt.ops.reference`.

    rms_norm(x [N, H], weight [H], eps) -> y [N, H]
    add_rms_norm(x [N, H], residual [N, H], weight, eps) -> (norm(x + residual), x + residual)
        (the Triton kernel writes the sum into `residual` and returns it)
    silu_and_mul(gate_up [N, 2I]) -> [N, I]
    qk_norm_rope_write(qkv, Hq, Hkv, D, q_weight, k_weight, eps, cos, sin, positions,
        k_cache, v_cache, page_table, full_precision, k_scale=None, v_scale=None)
        -> q [N, Hq, D] (k, v written); cos, sin [N, R/2]: the first R dims of each head are
        rotated (R < D: partial RoPE); a float8_e4m3fn cache stores k / k_scale and
        v / v_scale (fp32 scalar tensors on the device; `reference.quantize_kv`)
    candidates(logits [n, V], sampling, mode, round_idx, positions, mask_token_id=-1)
        -> (ids, confidences); the mask token (a model constant) is never a candidate
    """

    name: str
    rms_norm: Callable
    add_rms_norm: Callable
    silu_and_mul: Callable
    qk_norm_rope_write: Callable
    candidates: Callable


def get_ops(name: str) -> Ops:
    """The ops table `name` ("reference" or "triton"; the Triton one imports the kernels).

    Raises:
        OptionError: unknown name, or Triton is not installed.
    """
    if name not in NAMES:
        raise OptionError(f"unknown kernels {name!r}; one of {NAMES}")
    try:
        module = importlib.import_module(f"dlrt.ops.{name}")
    except ImportError as e:
        raise OptionError(f"kernels {name!r} need {e.name}: pip install {e.name}") from e
    return module.OPS
