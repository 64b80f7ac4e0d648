"""FP8 weights in the compressed-tensors layout (`quant_method: "compressed-tensors"`, `format:
"float-quantized"`): the FP8 checkpoints llm-compressor writes (most FP8 checkpoints on the
hub, e.g. the *-FP8-dynamic models), and the linear method that reads them (the format
"compressed-tensors-fp8", registered in `dlrt.layers.quant.registry`).

A folder declares it in config.json `quantization_config`:
    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"group_0": {"targets": ["Linear"],
         "weights": {"num_bits": 8, "type": "float", "strategy": "channel" | "tensor",
                     "symmetric": true, "dynamic": false},
         "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                               "dynamic": true} (or "strategy": "tensor", "dynamic": false:
                               static input scales; or null: weight-only)}},
     "ignore": ["lm_head", "re:.*mlp.gate$"], "kv_cache_scheme": null (or FP8 per tensor)}
Every group must target "Linear" with the same FP8 weights (a group's own "format", where
given, must be "float-quantized"). What dlrt does not run is a `CheckpointError` naming it and
what is read: integer or 4-bit weights, "group" / "block" / "tensor_group" strategies,
asymmetric or dynamic weights, other formats ("pack-quantized", "int-quantized",
"naive-quantized", "nvfp4-pack-quantized", "mixed-precision" with such a group), sparsity
(2:4), transforms, output activations, groups aimed at named modules, KV-cache schemes other
than FP8 per tensor.

Stored per weight [n, k]: `<module>.weight` float8_e4m3fn [n, k] and `<module>.weight_scale`
[n, 1] ("channel": one scale per output row) or [1] / [] ("tensor"), float32 or the model's
float dtype (converted to float32; exact); static checkpoints also hold `<module>.input_scale`,
which dlrt does not read. The weight is w[i, j] = weight[i, j] * weight_scale[i] (or the one
scale). Quantisation (make-checkpoint, online): per weight row, scale = amax(|w|) / 448 (1.0
for an all-zero row), weight = e4m3(clamp(w / scale, -448, 448)) rounded to nearest even, in
fp32; make-checkpoint writes the "channel" strategy with dynamic per-token activations.

Held by a layer: `weight` float8_e4m3fn [n, k] and `weight_scale` float32 [n, 1] (a "tensor"
scale on each row of its part), so the parts of merged projections and expert stacks
concatenate along rows.

Activations (the `fp8_activations` option, as for "fp8"): "dynamic" quantises x per token and
128-column group at run time (`dlrt.ops.Fp8Activation`, the codes of the quantising RMSNorm /
SiLU-and-mul ops): finer than the checkpoints' per-token (or static per-tensor) scales, never
coarser; "weight_only" keeps x in the model dtype (the exact product with the dequantised
weight). A checkpoint without `input_activations` (W8A16) runs weight-only whatever the option.
On a GPU of sm_89+ a load-time plan times `dlrt.kernels.fp8_gemm`'s tensor-core kernels on
per-channel scales (W8A8 or weight-only; not its GEMV) against this reference. Routed experts
are weight-only: the Triton MoE reads them as FP8 with their per-channel scales
(`dlrt.kernels.moe_fp8`; sm_89+ or the interpreter), the PyTorch MoE dequantises the experts
it reads (`StackedExperts.expert_weight`).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.errors import CheckpointError
from dlrt.layers.quant import PathNote, QuantFormat, not_convert_entries
from dlrt.layers.quant.fp8 import (
    Fp8Linear,
    check_fused_input,
    quantize_activations,
    set_activations,
)
from dlrt.layers.quant.registry import register
from dlrt.ops import E4M3_MAX, Fp8Activation, e4m3_scale

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
METHOD = "compressed-tensors"
FORMAT = "float-quantized"
STRATEGIES = ("channel", "tensor")
READS = ("quant_method 'compressed-tensors', format 'float-quantized': config groups "
         "targeting 'Linear' with 8-bit float weights, strategy 'channel' or 'tensor', "
         "symmetric, static; input activations 8-bit float, dynamic per token or static per "
         "tensor, or none; an FP8 per-tensor kv_cache_scheme or none")


def quantize_fp8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (float8_e4m3fn [n, k], scale float32 [n, 1]): per row, amax / 448."""
    w = w.float()
    scale = e4m3_scale(w.abs().amax(dim=-1, keepdim=True))
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale


def quantize_fp8_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (float8_e4m3fn [n, k], scale float32 []): one scale, amax / 448."""
    w = w.float()
    scale = e4m3_scale(w.abs().amax())
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale


def dequantize_fp8_channel(weight: torch.Tensor, scale: torch.Tensor,
                           dtype: torch.dtype) -> torch.Tensor:
    """Held tensors -> the weight: float8_e4m3fn [..., n, k] times float32 [..., n, 1] -> [...,
    n, k] in `dtype` (the product in fp32, then one cast)."""
    return (weight.float() * scale.float()).to(dtype)


def reference_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     activations: str) -> torch.Tensor:
    """The layer's reference: x [..., K] (quantised as a value per token and 128-column group
    when `activations` is "dynamic") @ the dequantised weight [N, K]^T in x's dtype."""
    if activations == "dynamic":
        x = quantize_activations(x)
    return F.linear(x, dequantize_fp8_channel(weight, scale, x.dtype))


def _fail(where: str, what: str) -> CheckpointError:
    return CheckpointError(f"{where}: {what} is not supported; dlrt reads {READS}")


def _args(value: Any, where: str, field: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: {field} must be an object, got {value!r}")
    return value


def _check_float8(args: dict[str, Any], where: str, field: str) -> None:
    kind = (args.get("num_bits"), args.get("type"))
    if kind != (8, "float"):
        raise _fail(where, f"{field} num_bits {kind[0]!r} type {kind[1]!r}")
    if args.get("symmetric", True) is not True:
        raise _fail(where, f"{field} symmetric {args.get('symmetric')!r} (zero points)")


def _weights(group: dict[str, Any], where: str) -> str:
    """The strategy of a group's weights, after checking them."""
    args = _args(group.get("weights"), where, "weights")
    if args is None:
        raise _fail(where, "a group without weights")
    _check_float8(args, where, "weights")
    if args.get("dynamic", False) is not False:
        raise _fail(where, f"weights dynamic {args.get('dynamic')!r}")
    strategy = args.get("strategy")
    if strategy not in STRATEGIES:
        raise _fail(where, f"weights strategy {strategy!r}")
    return strategy


def _activations(group: dict[str, Any], where: str) -> bool:
    """Whether a group quantises its input activations, after checking them."""
    args = _args(group.get("input_activations"), where, "input_activations")
    if _args(group.get("output_activations"), where, "output_activations") is not None:
        raise _fail(where, "output_activations")
    if args is None:
        return False
    _check_float8(args, where, "input_activations")
    scheme = (args.get("strategy"), bool(args.get("dynamic")))
    if scheme not in (("token", True), ("tensor", True), ("tensor", False)):
        raise _fail(where, f"input_activations strategy {scheme[0]!r} dynamic "
                           f"{args.get('dynamic')!r}")
    return True


def _kv_cache(q: dict[str, Any], where: str) -> None:
    args = _args(q.get("kv_cache_scheme"), where, "kv_cache_scheme")
    if args is None:
        return
    _check_float8(args, where, "kv_cache_scheme")
    if args.get("strategy", "tensor") != "tensor" or args.get("dynamic", False) is not False:
        raise _fail(where, f"kv_cache_scheme strategy {args.get('strategy')!r} dynamic "
                           f"{args.get('dynamic')!r}")


def _groups(q: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, group) of each config group, after checking its format and targets."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{where}: compressed-tensors config_groups must be a non-empty "
                              f"object, got {groups!r}")
    out = []
    for name, group in groups.items():
        at = f"{where} config_groups.{name}"
        if not isinstance(group, dict):
            raise CheckpointError(f"{at} must be an object, got {group!r}")
        fmt = group.get("format", q.get("format"))
        if fmt != FORMAT:
            raise _fail(at, f"format {fmt!r}")
        targets = group.get("targets")
        if not isinstance(targets, list) or "Linear" not in targets:
            raise _fail(at, f"targets {targets!r} (dlrt quantises every Linear layer but "
                            "those in ignore)")
        out.append((at, group))
    return out


def _settings(q: dict[str, Any], where: str) -> tuple[str, bool]:
    """(weights strategy, whether activations are quantised) of a checked config."""
    if q.get("format") not in (FORMAT, "mixed-precision", None):
        raise _fail(where, f"format {q.get('format')!r}")
    sparsity = q.get("sparsity_config")  # dense storage (zeros kept) reads as any weight
    if sparsity and not (isinstance(sparsity, dict) and sparsity.get("format") == "dense"):
        raise _fail(where, f"sparsity_config {sparsity!r}")
    if q.get("transform_config"):
        raise _fail(where, f"transform_config {q.get('transform_config')!r}")
    _kv_cache(q, where)
    schemes = {(_weights(g, at), _activations(g, at)) for at, g in _groups(q, where)}
    if len(schemes) > 1:
        raise _fail(where, f"config groups with different schemes {sorted(schemes)}")
    return schemes.pop()


class CtFp8Format(QuantFormat):
    """See the module docstring. `strategy`: the checkpoint's weight scales ("channel" or
    "tensor"); `activations`: whether it quantises input activations (False: W8A16, run
    weight-only)."""

    name = "compressed-tensors-fp8"
    declared = ("'compressed-tensors-fp8' (quant_method 'compressed-tensors', format "
                "'float-quantized': e4m3 weights with per-channel or per-tensor scales)")
    suffixes = ("weight", "weight_scale")

    def __init__(self, strategy: str = "channel", activations: bool = True):
        self.strategy, self.quantized_activations = strategy, activations
        self.expand = {"weight": 1, "weight_scale": 1 if strategy == "channel" else 0}

    def __repr__(self) -> str:
        return f"CtFp8Format({self.strategy!r}, activations={self.quantized_activations})"

    # -- the checkpoint ------------------------------------------------------------------------
    def reads(self, q):
        return q.get("quant_method") == METHOD

    def not_convert(self, q, where):
        _settings(q, where)
        skip = not_convert_entries(q.get("ignore"), "ignore", where)
        for entry in skip:
            if entry.startswith("re:"):
                try:
                    re.compile(entry[3:])
                except re.error as e:
                    raise CheckpointError(f"{where}: ignore entry {entry!r} is not a regular "
                                          f"expression: {e}") from e
        return skip

    def configured(self, q):
        strategy, activations = _settings(q, "quantization_config")
        if (strategy, activations) == (self.strategy, self.quantized_activations):
            return self
        return CtFp8Format(strategy, activations)

    def checkpoint_config(self, not_convert):
        float8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                  "block_structure": None, "actorder": None}
        group = {"targets": ["Linear"],
                 "weights": {**float8, "strategy": "channel", "dynamic": False},
                 "input_activations": {**float8, "strategy": "token", "dynamic": True},
                 "output_activations": None}
        return {"quant_method": METHOD, "format": FORMAT, "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "ignore": not_convert,
                "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
                "global_compression_ratio": None}, {}

    def path_note(self, capability):
        cc = f"{capability[0]}.{capability[1]}"
        if capability < (8, 9):
            return PathNote(f"{self.name} weights on a GPU of compute capability {cc}, which "
                            "has no FP8 tensor cores (sm_89+): served by the dequantising path "
                            "(each call dequantises its weight; slower than the unquantised "
                            "model)", slow=True)
        return PathNote(f"{self.name} weights on compute capability {cc}: projections by the "
                        "FP8 tensor-core kernels on per-channel scales where the load-time "
                        "plan finds them faster; routed experts of MoE layers read as FP8 by "
                        "the Triton MoE (weight-only)")

    # -- the activations -----------------------------------------------------------------------
    def set_activations(self, model, activations):
        if not self.quantized_activations and activations != "weight_only":
            log.info("%s: the checkpoint quantises no activations (W8A16): weight-only "
                     "products", self.name)
            activations = "weight_only"
        set_activations(model, activations)

    def check_activations(self, model, ops, dtype, device):
        check_fused_input(model, ops, dtype, device)

    # -- the weights ---------------------------------------------------------------------------
    def stored(self, suffix, n, k):
        if suffix == "weight":
            return (n, k), FP8
        return ((n, 1) if self.strategy == "channel" else ()), torch.float32

    def held(self, suffix, n, k):
        if suffix == "weight":
            return (n, k), FP8
        return (n, 1), torch.float32

    def quantize(self, w):
        fn = quantize_fp8_channel if self.strategy == "channel" else quantize_fp8_tensor
        q, scale = fn(w)
        return {"weight": q, "weight_scale": scale}

    def dequantize(self, held, k, dtype):
        return dequantize_fp8_channel(held["weight"], held["weight_scale"], dtype)

    def linear_method(self):
        return CtFp8Linear()

    # -- the kernels of a load-time plan -------------------------------------------------------
    def tuned(self, layer):
        return isinstance(layer.method, CtFp8Linear)

    def kernel_args(self, layer):
        return layer.weight, layer.weight_scale

    def activations(self, layer):
        return layer.method.activations

    def reference(self, activations="weight_only"):
        return lambda x, w, s: reference_linear(x, w, s, activations)

    def kernel_configs(self, n, k, rows, device=None, activations="weight_only"):
        from dlrt.kernels.fp8_gemm import fp8_candidates

        return fp8_candidates(n, k, w8a8=activations == "dynamic", device=device, rows=rows,
                              channel=True)

    def kernel(self, config):
        from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm

        return functools.partial(fp8_gemm, config=Fp8GemmConfig(**config))


class CtFp8Linear(Fp8Linear):
    """y = x @ w^T with w held as e4m3 rows and per-row scales (`layer.weight`,
    `layer.weight_scale` float32 [N, 1]); the activation modes, the planned kernel (an
    `Fp8Kernel` taking the per-channel scales: `dlrt.kernels.fp8_gemm.fp8_gemm` with a "dot"
    config) and the fused input are `Fp8Linear`'s. Without a kernel (the CPU, prefill rows) the
    reference path: x quantised as a value when "dynamic", the weight dequantised into x's
    dtype for this call (never kept), then `F.linear`."""

    name = "compressed-tensors-fp8"

    def apply(self, layer: nn.Module, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        w, scale = layer.weight, layer.weight_scale
        if isinstance(x, Fp8Activation):  # [N, K], quantised by its producer
            kernel = self.kernel_for(x.q.shape[0]) if x.q.is_cuda else None
            if kernel is not None:
                return kernel(x, w, scale)
            return F.linear(x.dequantize(), dequantize_fp8_channel(w, scale, x.dtype))
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        kernel = self.kernel_for(rows) if x.is_cuda else None
        if kernel is not None:
            y = kernel(x.reshape(rows, x.shape[-1]).contiguous(), w, scale)
            return y.reshape(*x.shape[:-1], y.shape[-1])
        return reference_linear(x, w, scale, self.activations)

    def __repr__(self) -> str:
        return f"CtFp8Linear(activations={self.activations!r}, kernel={self.kernel!r})"


CT_FP8_FORMAT = register(CtFp8Format())
