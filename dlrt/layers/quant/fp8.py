"""FP8 block-scaled weights: the Hugging Face `quant_method: "fp8"` layout of the Qwen3-*-FP8
and DeepSeek-V3 checkpoints, and the linear method that reads them (the format "fp8",
registered in `dlrt.layers.quant.registry`).

A folder declares it in config.json: `quantization_config` {"quant_method": "fp8", "fmt":
"e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic", optional
"modules_to_not_convert" (or "ignored_layers")}. The kernels a load-time plan times
(`dlrt.kernels.fp8_gemm`): with dynamic activations the W8A8 configs, weight-only the "dot"
configs and, at rows <= 4, the "fma" GEMV configs.

Stored per weight [n, k]: `<module>.weight` float8_e4m3fn [n, k] and `<module>.weight_scale_inv`
float32 [ceil(n/128), ceil(k/128)]; the weight is w[i, j] = weight[i, j] * weight_scale_inv[i //
128, j // 128] (the last blocks may be partial). Quantisation (make-checkpoint, online):
per 128x128 block, scale = amax(|w|) / 448 (1.0 for an all-zero block), weight =
e4m3(clamp(w / scale, -448, 448)) rounded to nearest even, all in fp32.

Held by a layer: `weight` float8_e4m3fn [n, k] and `weight_scale_inv` float32, either as
stored, [ceil(n/128), ceil(k/128)] (`FP8_FORMAT`: every part of a merged projection or expert
stack but the last is a multiple of 128 rows, so the parts' scale rows concatenate: the real
SDAR, LLaDA and LLaDA2 models), or [n, ceil(k/128)] with each stored scale row repeated for its
128 weight rows (`FP8_ROWS_FORMAT`: parts of other sizes: DiffusionGemma's MLPs and experts,
whose gate and up parts have 2112 and 704 rows, tiny test models).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.errors import CheckpointError
from dlrt.layers.quant import LinearMethod, PathNote, QuantFormat, not_convert_entries
from dlrt.layers.quant.registry import register
from dlrt.ops import E4M3_MAX, Fp8Activation, Ops, e4m3_scale

log = logging.getLogger(__name__)

BLOCK = 128
FP8 = torch.float8_e4m3fn

# The kernel seam of `Fp8Linear`: (x [M, K] in the model dtype, contiguous; weight
# float8_e4m3fn [N, K]; weight_scale_inv float32 [ceil(N/128), ceil(K/128)]) -> x @ w^T [M, N]
# in x's dtype, e.g. `dlrt.kernels.fp8_gemm.fp8_gemm` (block-layout weights only).
Fp8Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


ACTIVATIONS = ("dynamic", "weight_only")


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _check_activations(activations: str) -> None:
    if activations not in ACTIVATIONS:
        raise ValueError(f"fp8 activations {activations!r}: one of {ACTIVATIONS}")


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """The dynamic FP8 activation quantisation of block-scaled checkpoints (their
    `activation_scheme: "dynamic"`) as a value: x [..., K] -> the codes times their scales
    (`dlrt.ops.Fp8Activation.quantize`; the product in fp32, then one cast) in x's dtype."""
    return Fp8Activation.quantize(x).dequantize()


def quantize_fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (float8_e4m3fn [n, k], scale_inv float32 [ceil(n/128), ceil(k/128)])."""
    n, k = w.shape
    nb, kb = _blocks(n), _blocks(k)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.view(nb, BLOCK, kb, BLOCK)
    amax = tiles.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = e4m3_scale(amax)
    q = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.view(nb * BLOCK, kb * BLOCK)[:n, :k].to(FP8)
    return q, scale


def dequantize_fp8_block(weight: torch.Tensor, scale_rows: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    """Held tensors -> the weight: weight float8_e4m3fn [..., n, k], scale_rows float32
    [..., ceil(n/128), ceil(k/128)] (block rows) or [..., n, ceil(k/128)] (a row per weight
    row) -> [..., n, k] in `dtype` (the product in fp32, then one cast)."""
    n, k = weight.shape[-2:]
    if scale_rows.shape[-2] != n:
        scale_rows = scale_rows.repeat_interleave(BLOCK, dim=-2)[..., :n, :]
    scale = scale_rows.repeat_interleave(BLOCK, dim=-1)[..., :k]
    return (weight.float() * scale).to(dtype)


class Fp8Format(QuantFormat):
    """See the module docstring."""

    name = "fp8"
    declared = "'fp8' (quant_method 'fp8': block-scaled e4m3, 128x128 blocks)"
    suffixes = ("weight", "weight_scale_inv")

    def __init__(self, block_rows: bool):
        self.block_rows = block_rows
        self.expand = {"weight": 1, "weight_scale_inv": 1 if block_rows else BLOCK}
        self.row_block = {"weight": 1, "weight_scale_inv": BLOCK if block_rows else 1}

    def for_parts(self, parts):
        aligned = all(size % BLOCK == 0 for sizes in parts for size in sizes[:-1])
        return FP8_FORMAT if aligned else FP8_ROWS_FORMAT

    def stored(self, suffix, n, k):
        if suffix == "weight":
            return (n, k), FP8
        return (_blocks(n), _blocks(k)), torch.float32

    def held(self, suffix, n, k):
        if suffix == "weight" or self.block_rows:
            return self.stored(suffix, n, k)
        return (n, _blocks(k)), torch.float32

    def quantize(self, w):
        q, scale = quantize_fp8_block(w)
        return {"weight": q, "weight_scale_inv": scale}

    def dequantize(self, held, k, dtype):
        return dequantize_fp8_block(held["weight"], held["weight_scale_inv"], dtype)

    def linear_method(self):
        return Fp8Linear()

    def reads(self, q):
        return q.get("quant_method") == "fp8"

    def not_convert(self, q, where):
        block = q.get("weight_block_size")
        if block != [BLOCK, BLOCK]:
            raise CheckpointError(f"{where}: fp8 weight_block_size {block!r} is not supported; "
                                  f"dlrt reads block-scaled FP8 with weight_block_size [{BLOCK}, "
                                  f"{BLOCK}]")
        if q.get("fmt", "e4m3") != "e4m3":
            raise CheckpointError(f"{where}: fp8 fmt {q.get('fmt')!r} is not supported (e4m3 "
                                  "only)")
        if q.get("activation_scheme", "dynamic") != "dynamic":
            raise CheckpointError(f"{where}: fp8 activation_scheme "
                                  f"{q.get('activation_scheme')!r} is not supported; dlrt reads "
                                  "block-scaled FP8 with dynamic activations (per token and "
                                  "128-column group; or weight-only with "
                                  "fp8_activations='weight_only')")
        skip = q.get("ignored_layers", q.get("modules_to_not_convert"))
        return not_convert_entries(skip, "modules_to_not_convert", where)

    def checkpoint_config(self, not_convert):
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK],
                "modules_to_not_convert": not_convert}, {}

    def path_note(self, capability):
        if capability >= (8, 9):
            return None
        return PathNote(f"{self.name} weights on a GPU of compute capability {capability[0]}."
                        f"{capability[1]}, which has no FP8 tensor cores (sm_89+): served by "
                        "the dequantising path (each call dequantises its weight; slower than "
                        "the unquantised model)", slow=True)

    def set_activations(self, model, activations):
        set_activations(model, activations)

    def check_activations(self, model, ops, dtype, device):
        check_fused_input(model, ops, dtype, device)

    def tuned(self, layer):
        """Layers with block-row scales (`FP8_FORMAT`); those with a scale row per weight row
        keep the reference path."""
        return self.block_rows and isinstance(layer.method, Fp8Linear)

    def kernel_args(self, layer):
        return layer.weight, layer.weight_scale_inv

    def activations(self, layer):
        return layer.method.activations

    def reference(self, activations="weight_only"):
        return lambda x, w, s: reference_linear(x, w, s, activations)

    def kernel_configs(self, n, k, rows, device=None, activations="weight_only"):
        from dlrt.kernels.fp8_gemm import fp8_candidates

        return fp8_candidates(n, k, w8a8=activations == "dynamic", device=device, rows=rows)

    def kernel(self, config):
        from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm

        return functools.partial(fp8_gemm, config=Fp8GemmConfig(**config))


class Fp8Linear(LinearMethod):
    """y = x @ w^T with w held as FP8 blocks (`layer.weight`, `layer.weight_scale_inv`).

    `activations`: "dynamic" (W8A8: x quantised per token and 128-column group at run time,
    `quantize_activations`, as vLLM and SGLang run block-scaled checkpoints) or "weight_only"
    (x stays in the model dtype: the exact product with the dequantised weight).
    `kernel` (an `Fp8Kernel`, e.g. `dlrt.kernels.fp8_gemm.fp8_gemm` with a config of the same
    activation mode) serves CUDA inputs of at most `max_rows` rows when set (by the load-time
    plan, `dlrt.tuning.quant`) and the scales are in block rows (`FP8_FORMAT`); `wide`
    (another `Fp8Kernel`) serves the rows above `max_rows` up to `wide_rows` (a plan that
    picked a 4-row GEMV for a round's rows keeps a tensor-core kernel for the folded phase's
    2B rows). Otherwise (the CPU, prefill rows, a GPU without a kernel) the reference path:
    x quantised as a value when "dynamic", the weight dequantised block by block into x's
    dtype for this call (never kept), then `F.linear`.
    """

    name = "fp8"
    quantized = True

    def __init__(self, kernel: Fp8Kernel | None = None, max_rows: int = 64,
                 wide: Fp8Kernel | None = None, wide_rows: int = 64,
                 activations: str = "dynamic", fused_input: bool = True):
        _check_activations(activations)
        self.kernel, self.max_rows = kernel, max_rows
        self.wide, self.wide_rows = wide, wide_rows
        self.activations = activations
        self.fused_input = fused_input  # off when `check_fused_input` fails at load

    def mode(self) -> dict:
        """The settings a load-time plan must keep when it gives the layer a kernel (as
        keyword arguments of the constructor)."""
        return dict(activations=self.activations, fused_input=self.fused_input)

    def planned(self, kernel, config):
        """This method's activation mode and fused input with `kernel` for up to its config's
        rows (a 4-row GEMV keeps the default weight-only "dot" kernel, `fp8_gemm`, for the
        rows above it up to `max_rows`: the folded phase's 2B rows), or the reference path. A
        method of this one's class (subclasses: other scale layouts)."""
        if kernel is None:
            return type(self)(max_rows=self.max_rows, **self.mode())
        from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm

        most = Fp8GemmConfig(**config).max_rows()
        wide = dict(wide=fp8_gemm, wide_rows=self.max_rows) if most < self.max_rows else {}
        return type(self)(kernel, max_rows=min(most, self.max_rows), **wide, **self.mode())

    def kernel_for(self, rows: int) -> Fp8Kernel | None:
        """The kernel serving `rows` rows on the GPU (None: the reference path)."""
        if rows <= self.max_rows:
            return self.kernel
        return self.wide if rows <= self.wide_rows else None

    def takes_fp8(self, rows: int) -> bool:
        """Whether an input of `rows` rows may come as an `Fp8Activation` (W8A8: the codes
        and scales it would make itself); the producing op then quantises in its kernel.
        True in "dynamic" mode when `rows` go to the reference path or to a W8A8 kernel (a
        `functools.partial` of `fp8_gemm` with a W8A8 config)."""
        if self.activations != "dynamic" or not self.fused_input:
            return False
        kernel = self.kernel_for(rows)
        config = getattr(kernel, "keywords", {}).get("config")
        return kernel is None or bool(getattr(config, "w8a8", False))

    def apply(self, layer: nn.Module, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        w, scale = layer.weight, layer.weight_scale_inv
        if isinstance(x, Fp8Activation):  # [N, K], quantised by its producer
            if x.q.is_cuda and scale.shape[0] == _blocks(w.shape[0]):
                kernel = self.kernel_for(x.q.shape[0])
                if kernel is not None:
                    return kernel(x, w, scale)
            return F.linear(x.dequantize(), dequantize_fp8_block(w, scale, x.dtype))
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if x.is_cuda and scale.shape[0] == _blocks(w.shape[0]):
            kernel = self.kernel_for(rows)
            if kernel is not None:
                y = kernel(x.reshape(rows, x.shape[-1]).contiguous(), w, scale)
                return y.reshape(*x.shape[:-1], y.shape[-1])
        return reference_linear(x, w, scale, self.activations)

    def __repr__(self) -> str:
        return f"Fp8Linear(activations={self.activations!r}, kernel={self.kernel!r})"


def reference_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                     activations: str) -> torch.Tensor:
    """The FP8 layer's reference: x [..., K] (quantised as a value when `activations` is
    "dynamic") @ the dequantised weight [N, K]^T in x's dtype -> [..., N]."""
    if activations == "dynamic":
        x = quantize_activations(x)
    return F.linear(x, dequantize_fp8_block(weight, scale_inv, x.dtype))


def check_fused_input(model: nn.Module, ops: Ops, dtype: torch.dtype,
                      device: torch.device) -> bool:
    """Whether `ops`' quantising producers (`add_rms_norm_fp8`, `silu_and_mul_fp8`) give on
    `device`, for random rows in `dtype`, exactly the codes and scales of
    `Fp8Activation.quantize` of the plain ops' outputs. When they differ or raise (a kernel
    that does not build on this GPU), every W8A8 layer of `model` takes tensors again and
    quantises them itself (`fused_input` off), and a warning says why. Run once at load."""
    methods = [m.method for m in model.modules()
               if isinstance(getattr(m, "method", None), Fp8Linear)
               and m.method.activations == "dynamic"]
    if not methods:
        return True
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    def same(a: Fp8Activation, b: Fp8Activation) -> bool:
        return (torch.equal(a.q.view(torch.uint8), b.q.view(torch.uint8))
                and torch.equal(a.scale, b.scale))

    why = None
    try:
        for rows, width in ((1, 200), (4, 1024)):
            x, res, w = rand(rows, width), rand(rows, width), rand(width).abs() + 0.5
            fused = ops.add_rms_norm_fp8(x, res.clone(), w, 1e-6)[0]
            plain = Fp8Activation.quantize(ops.add_rms_norm(x, res.clone(), w, 1e-6)[0])
            gate_up = rand(rows, 2 * width) * 4
            if not (same(fused, plain) and same(ops.silu_and_mul_fp8(gate_up),
                                                Fp8Activation.quantize(
                                                    ops.silu_and_mul(gate_up)))):
                why = "their codes differ from the unfused ops'"
    except Exception as e:  # NOTE: a kernel build or launch failure of any type
        why = f"{type(e).__name__}: {e}"
    if why is None:
        return True
    for method in methods:
        method.fused_input = False
    log.warning("FP8 W8A8: the quantising RMSNorm / SiLU-and-mul kernels (%s ops) fail their "
                "load-time check on %s (%s); each FP8 layer quantises its input itself",
                ops.name, device, why)
    return False


def set_activations(model: nn.Module, activations: str) -> int:
    """Set the activation mode of every FP8 linear layer of `model`; the number of layers."""
    _check_activations(activations)
    methods = [m.method for m in model.modules() if isinstance(getattr(m, "method", None),
                                                                Fp8Linear)]
    for method in methods:
        method.activations = activations
    return len(methods)


FP8_FORMAT = register(Fp8Format(block_rows=True))
FP8_ROWS_FORMAT = Fp8Format(block_rows=False)  # a variant of "fp8" (`Fp8Format.for_parts`)
