"""NVFP4 weights: the layout of NVIDIA ModelOpt's NVFP4 export (`quant_algo: "NVFP4"`, group
size 16), and the linear method that reads them (the format "nvfp4", registered in
`dlrt.layers.quant.registry`).

A folder declares it in ModelOpt's `hf_quant_config.json` {"quantization": {"quant_algo":
"NVFP4", "group_size": 16, "exclude_modules": [...], "kv_cache_quant_algo": ...}} and/or
config.json `quantization_config` {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore":
[...], "config_groups": {... "weights": {"group_size": 16, ...}}, "kv_cache_scheme": ...} (or
that object's ModelOpt form nested under "quantization"); quant_method "modelopt" or
"modelopt_fp4", quant_algo in any case. A KV-cache algorithm is not an error: its per-layer
scales serve `kv_cache_dtype="fp8"` (`dlrt.checkpoint.kv_scales`). The kernels a load-time
plan times: `dlrt.kernels.nvfp4_gemm` (weight-only).

Stored per weight [n, k] (k a multiple of 16):
  `<module>.weight` uint8 [n, k/2]: e2m1 codes, two per byte, element 2j in the low nibble and
      element 2j+1 in the high nibble (ModelOpt's `NVFP4QTensor` packing); a code is sign bit 3
      plus magnitude index 0..7 of (0, 0.5, 1, 1.5, 2, 3, 4, 6);
  `<module>.weight_scale` float8_e4m3fn [n, k/16]: one scale per group of 16 along k;
  `<module>.weight_scale_2` float32 [] (or [1]): the global scale of the tensor;
  `<module>.input_scale` float32 []: the activation scale, which this weight-only path ignores
      (and `make_checkpoint` does not write).
The weight is w[i, j] = e2m1(code[i, j]) * weight_scale[i, j // 16] * weight_scale_2.
Quantisation (make-checkpoint, online), in fp32: weight_scale_2 = amax(|w|) / (6 * 448) (1.0 for
an all-zero weight); group scale = group amax / (6 * weight_scale_2), 1.0 where 0, clamped to
448 and cast to e4m3; codes = w / (group scale * weight_scale_2) rounded to the nearest e2m1
value, ties to the even code, magnitudes above 6 to 6.

Held by a layer (one row per weight row): `weight` uint8 [n, k/2], `weight_scale`
float8_e4m3fn [n, k/16], `weight_scale_2` float32 [n] (each part's global scale on its rows,
so merged projections whose parts have different global scales stay exact).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.errors import CheckpointError
from dlrt.layers.quant import (
    HF_QUANT_CONFIG,
    LinearMethod,
    PathNote,
    QuantFormat,
    not_convert_entries,
)
from dlrt.layers.quant.registry import register

GROUP = 16
# The kernel seam of `Nvfp4Linear`: (x [M, K] in the model dtype, contiguous; weight uint8
# [N, K/2]; weight_scale float8_e4m3fn [N, K/16]; weight_scale_2 float32 [N]) -> x @ w^T
# [M, N] in x's dtype.
Nvfp4Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_UP_AT = (0.75, 1.75, 3.5)  # midpoints whose upper neighbour has the even code


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (already scaled) -> e2m1 codes uint8 (round to nearest, ties to even)."""
    mag = v.abs()
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=v.device)
    code = torch.bucketize(mag, mids)  # the midpoints strictly below mag
    for m in _UP_AT:
        code = code + (mag == m).long()
    return (code + 8 * (v < 0).long()).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (any int dtype) -> fp32 values. Computed from the code's bits (magnitude
    index m = 2e + b: 0.5 b when e = 0, else 2^(e-1) (1 + b/2)), so no host table is copied
    to the device (the path runs inside captured graphs)."""
    c = codes.long()
    e, b = ((c >> 1) & 3).float(), (c & 1).float()
    mag = torch.where(e == 0, 0.5 * b, torch.exp2(e - 1) * (1 + 0.5 * b))
    return torch.where((c & 8) != 0, -mag, mag)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., k] -> [..., k/2]: element 2j low nibble, 2j+1 high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., k/2] -> codes uint8 [..., k]."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [n, k] -> (uint8 [n, k/2], float8_e4m3fn [n, k/16], float32 [])."""
    n, k = w.shape
    w = w.float()
    amax = w.abs().amax()
    global_scale = amax / (E2M1_MAX * E4M3_MAX) if amax > 0 else torch.ones((), device=w.device)
    groups = w.view(n, k // GROUP, GROUP)
    scale = groups.abs().amax(dim=-1) / (E2M1_MAX * global_scale)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale).clamp(max=E4M3_MAX)
    scale = scale.to(torch.float8_e4m3fn)
    scaled = groups / (scale.float() * global_scale)[..., None]
    return pack(e2m1_codes(scaled).view(n, k)), scale, global_scale.float().reshape(())


def dequantize_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor,
                     weight_scale_2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Held tensors -> the weight: uint8 [..., n, k/2], float8_e4m3fn [..., n, k/16], float32
    [..., n] -> [..., n, k] in `dtype` (the products in fp32, then one cast)."""
    values = e2m1_values(unpack(weight))
    k = values.shape[-1]
    scale = weight_scale.float() * weight_scale_2.float()[..., None]
    values = values.view(*values.shape[:-1], k // GROUP, GROUP) * scale[..., None]
    return values.view(*values.shape[:-2], k).to(dtype)


def _modelopt(q: dict) -> dict:
    """The ModelOpt settings of a quantization config: its "quantization" object where it
    nests one (ModelOpt's own form inside config.json), else the config itself."""
    inner = q.get("quantization")
    return inner if isinstance(inner, dict) else q


class Nvfp4Format(QuantFormat):
    """See the module docstring."""

    name = "nvfp4"
    declared = ("'nvfp4' (ModelOpt's NVFP4: quant_method 'modelopt' or hf_quant_config.json, "
                "quant_algo 'NVFP4', group size 16)")
    files = (HF_QUANT_CONFIG,)
    suffixes = ("weight", "weight_scale", "weight_scale_2")
    expand = {"weight": 1, "weight_scale": 1, "weight_scale_2": 0}

    def check(self, n, k):
        if k % GROUP:
            raise ValueError(f"NVFP4 needs in features divisible by {GROUP}, got {k}")

    def stored(self, suffix, n, k):
        if suffix == "weight":
            return (n, k // 2), torch.uint8
        if suffix == "weight_scale":
            return (n, k // GROUP), torch.float8_e4m3fn
        return (), torch.float32

    def held(self, suffix, n, k):
        if suffix == "weight_scale_2":
            return (n,), torch.float32
        return self.stored(suffix, n, k)

    def quantize(self, w):
        q, scale, scale_2 = quantize_nvfp4(w)
        return {"weight": q, "weight_scale": scale, "weight_scale_2": scale_2}

    def dequantize(self, held, k, dtype):
        return dequantize_nvfp4(held["weight"], held["weight_scale"], held["weight_scale_2"],
                                dtype)

    def linear_method(self):
        return Nvfp4Linear()

    def reads(self, q):
        method = q.get("quant_method")
        return (method is None or str(method).lower() in ("modelopt", "modelopt_fp4")) \
            and str(_modelopt(q).get("quant_algo", "")).upper() == "NVFP4"

    def not_convert(self, q, where):
        q = _modelopt(q)
        group = q.get("group_size")
        if group is None:
            groups = q.get("config_groups") or {}
            group = next((g.get("weights", {}).get("group_size") for g in groups.values()
                          if isinstance(g, dict)), GROUP)
        if group != GROUP:
            raise CheckpointError(f"{where}: NVFP4 group_size {group!r} is not supported "
                                  f"({GROUP} only)")
        skip = q.get("exclude_modules", q.get("ignore"))
        return not_convert_entries(skip, "exclude_modules", where)

    def checkpoint_config(self, not_convert):
        quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP,
                 "exclude_modules": not_convert}
        producer = {"name": "modelopt", "version": "dlrt"}
        config = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": producer,
                  "ignore": not_convert,
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                      "dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}}}}
        return config, {HF_QUANT_CONFIG: {"producer": producer, "quantization": quant}}

    def path_note(self, capability):
        if capability >= (10, 0):
            return None
        where = f"nvfp4 weights on compute capability {capability[0]}.{capability[1]}, which has"
        if capability < (8, 9):
            return PathNote(f"{where} no e4m3 conversions (sm_89+) for the group scales: a "
                            "weight-only kernel serves a layer only where it passes its "
                            "load-time check, else the dequantising path (each call "
                            "dequantises its weight; slower than the unquantised model)",
                            slow=True)
        return PathNote(f"{where} no FP4 tensor cores (sm_100+): weight-only kernels (codes "
                        "dequantised in registers, products in the model dtype)")

    def tuned(self, layer):
        return isinstance(layer.method, Nvfp4Linear)

    def kernel_args(self, layer):
        return layer.weight, layer.weight_scale, layer.weight_scale_2

    def reference(self, activations="weight_only"):
        return lambda x, w, s, g: F.linear(x, dequantize_nvfp4(w, s, g, x.dtype))

    def kernel_configs(self, n, k, rows, device=None, activations="weight_only"):
        from dlrt.kernels.nvfp4_gemm import nvfp4_candidates

        return nvfp4_candidates(n, k, device=device)

    def kernel(self, config):
        from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig, nvfp4_gemm

        return functools.partial(nvfp4_gemm, config=Nvfp4GemmConfig(**config))


class Nvfp4Linear(LinearMethod):
    """y = x @ w^T with w held as NVFP4 (`layer.weight`, `weight_scale`, `weight_scale_2`).

    `kernel` (an `Nvfp4Kernel`, e.g. `dlrt.kernels.nvfp4_gemm.nvfp4_gemm`) serves CUDA inputs
    of at most `max_rows` rows when set (by the load-time plan, `dlrt.tuning.quant`).
    Otherwise (the CPU, prefill rows, no kernel) the reference path: the weight is dequantised
    into x's dtype for this call (never kept), then `F.linear`.
    """

    name = "nvfp4"
    quantized = True

    def __init__(self, kernel: Nvfp4Kernel | None = None, max_rows: int = 64):
        self.kernel, self.max_rows = kernel, max_rows

    def planned(self, kernel, config):
        if kernel is None:
            return Nvfp4Linear(max_rows=self.max_rows)
        from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig

        return Nvfp4Linear(kernel, max_rows=min(Nvfp4GemmConfig(**config).max_rows(),
                                                self.max_rows))

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        w, scale, scale_2 = layer.weight, layer.weight_scale, layer.weight_scale_2
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if self.kernel is not None and x.is_cuda and rows <= self.max_rows:
            y = self.kernel(x.reshape(rows, x.shape[-1]).contiguous(), w, scale, scale_2)
            return y.reshape(*x.shape[:-1], y.shape[-1])
        return F.linear(x, dequantize_nvfp4(w, scale, scale_2, x.dtype))


NVFP4_FORMAT = register(Nvfp4Format())
