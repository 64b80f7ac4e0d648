"""Linear methods: how a linear layer computes y = x @ W^T from the weights it holds, and the
quantised weight formats they read.

Every `Linear` / `MergedLinear` holds one `LinearMethod`, set at load from a plan
(`dlrt.tuning.linear`) or by quantisation (`dlrt.layers.quant.convert`): `unquantized` (cuBLAS,
or dlrt's skinny Triton GEMM for a few rows), `fp8` (128x128 block-scaled float8_e4m3fn),
`nvfp4` (e2m1 in groups of 16 with e4m3 group scales and a global fp32 scale),
`compressed_tensors` (float8_e4m3fn with a scale per output row or per tensor). A method may own
weights besides `layer.weight` (scales).

A `QuantFormat` describes one quantised weight [n, k] twice: as the checkpoint stores it
(`stored`: per tensor suffix, the shape and dtype of one checkpoint tensor such as
`q_proj.weight_scale_inv`) and as a layer holds it (`held`). A held tensor has one row per
`row_block[suffix]` weight rows, so the parts of a merged projection or of an expert stack
concatenate along rows; `expand[suffix]` is the number of held rows per stored row (0: one
scalar for all rows). `for_parts` picks the variant that fits a module's parts (FP8: block
rows when every part boundary falls on a 128-row block, else one scale row per weight row).

A format owns everything else about itself too, in its own module, registered by name
(`dlrt.layers.quant.registry`): how a checkpoint folder declares it and which modules it leaves
unquantised, the config a written checkpoint gets, its `LinearMethod`, what serves it on a GPU
of a given compute capability (`path_note`), how its layers take their activations
(`set_activations`, `check_activations`: FP8's W8A8 mode), and the kernels a load-time plan may
time for it (`dlrt.tuning.quant` runs them). The checkpoint reader
(`dlrt.checkpoint.quant`), make-checkpoint and the plan are generic over the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlrt.errors import CheckpointError
from dlrt.ops import Ops

# ModelOpt's quantization config, beside config.json (its "quantization" object)
HF_QUANT_CONFIG = "hf_quant_config.json"


class LinearMethod:
    """The interface. `name` is what reports show ("cublas", "triton", "fp8", ...);
    `quantized` methods read quantised weights, which load-time plans leave alone."""

    name = "base"
    quantized = False

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] with the layer's weight [N, K]."""
        raise NotImplementedError

    def takes_fp8(self, rows: int) -> bool:
        """Whether `apply` takes an input of `rows` rows as a `dlrt.ops.Fp8Activation` (FP8
        W8A8 methods); the model's producing op then returns one (`dlrt.layers.norm`)."""
        return False

    def planned(self, kernel: Callable | None, config: dict | None) -> LinearMethod:
        """A method of this one's settings whose rows `kernel` serves (a kernel of the
        layer's format bound to `config`, `QuantFormat.kernel`), or the reference path when
        kernel is None: what a load-time plan gives a quantised layer."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


@dataclass(frozen=True)
class PathNote:
    """What serves a format's layers on a GPU (`QuantFormat.path_note`): `text` for the log;
    `slow` when that path is slower than the unquantised model (a warning, else an info
    line)."""

    text: str
    slow: bool = False


class QuantFormat:
    """One weight format (see the module docstring). Subclasses: `fp8.Fp8Format`,
    `nvfp4.Nvfp4Format`, `compressed_tensors.CtFp8Format`; a module defining one registers it
    (`dlrt.layers.quant.registry.register`).

    The checkpoint: `reads(q)`, `not_convert(q, where)`, `configured(q)`,
    `checkpoint_config(not_convert)`,
    `declared` (how a folder declares the format, for errors), `files` (JSON files beside
    config.json its checkpoints may hold).
    The device and the activations: `path_note(capability)`, `set_activations(model, mode)`
    (before the weights load), `check_activations(model, ops, dtype, device)` (after).
    The weights: `suffixes`, `stored`, `held`, `expand`, `row_block`, `for_parts`, `check`,
    `quantize`, `dequantize`, `linear_method`.
    The kernels a load-time plan times for a layer (`dlrt.tuning.quant`): `tuned(layer)`,
    `kernel_args(layer)`, `activations(layer)`, `reference(activations)`,
    `kernel_configs(...)`, `kernel(config)`, `tolerance`; the layer then gets
    `layer.method.planned(kernel, config)`.
    """

    name = "base"
    declared = ""
    files: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ("weight",)  # checkpoint tensors of one weight, weight first
    expand: dict[str, int] = {}
    row_block: dict[str, int] = {}  # weight rows per held row (1 when absent)
    tolerance = 2e-2  # a kernel's relative error against the reference, at most

    # -- the checkpoint ------------------------------------------------------------------------
    def reads(self, q: dict[str, Any]) -> bool:
        """Whether the quantization config `q` (config.json's `quantization_config`, or the
        "quantization" object of ModelOpt's `HF_QUANT_CONFIG`) declares this format."""
        return False

    def not_convert(self, q: dict[str, Any], where: str) -> tuple[str, ...]:
        """The modules (names or patterns) a checkpoint declaring `q` leaves unquantised, after
        checking the settings of `q`.

        Raises:
            CheckpointError: a setting dlrt cannot read (the message starts with `where`).
        """
        return ()

    def configured(self, q: dict[str, Any]) -> QuantFormat:
        """The variant of this format that reads a checkpoint declaring `q` (checked by
        `not_convert` first), e.g. compressed-tensors FP8 with per-tensor rather than
        per-channel scales. Default: this format."""
        return self

    def checkpoint_config(self, not_convert: list[str]
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(config.json `quantization_config`, extra JSON files by name, among `files`) of a
        checkpoint written in this format with the modules `not_convert` left unquantised
        (`dlrt.checkpoint.make.make_checkpoint`)."""
        raise NotImplementedError

    def path_note(self, capability: tuple[int, int]) -> PathNote | None:
        """What serves the format's layers on a GPU of compute capability `capability` (e.g.
        (9, 0)) when it is worth a line in the log (None: nothing to say; on the CPU the
        dequantising reference path serves every format)."""
        return None

    # -- the activations -----------------------------------------------------------------------
    def set_activations(self, model: nn.Module, activations: str) -> None:
        """Before the weights load: give `model`'s layers holding this format the activation
        mode `activations` (the `fp8_activations` option: "dynamic" or "weight_only").
        Default: nothing (a format whose layers take activations in the model dtype)."""

    def check_activations(self, model: nn.Module, ops: Ops, dtype: torch.dtype,
                          device: torch.device) -> None:
        """After the weights load: check on `device`, in `dtype`, what the layers' activation
        mode needs of `ops`, and fall back (with a warning) where it fails. Default:
        nothing."""

    # -- the weights ---------------------------------------------------------------------------
    def for_parts(self, parts: list[list[int]]) -> QuantFormat:
        """The variant for a module whose weights have these part sizes (rows, in order)."""
        return self

    def check(self, n: int, k: int) -> None:
        """Raise ValueError when a weight [n, k] cannot be held in this format."""

    def stored(self, suffix: str, n: int, k: int) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of checkpoint tensor `<module>.<suffix>` of a weight [n, k]."""
        raise NotImplementedError

    def held(self, suffix: str, n: int, k: int) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of the layer's tensor for `suffix`: first dimension n."""
        raise NotImplementedError

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """A weight [n, k] (any float dtype; computed in fp32) -> its stored tensors."""
        raise NotImplementedError

    def dequantize(self, held: dict[str, torch.Tensor], k: int,
                   dtype: torch.dtype) -> torch.Tensor:
        """Held tensors (leading dims allowed, e.g. experts) -> the weight [..., n, k] in
        `dtype`."""
        raise NotImplementedError

    def linear_method(self) -> LinearMethod:
        """The CPU-complete method of a linear layer holding this format."""
        raise NotImplementedError

    # -- the kernels of a load-time plan -------------------------------------------------------
    def tuned(self, layer: nn.Module) -> bool:
        """Whether a load-time plan may give `layer` (a linear layer holding this format) a
        kernel. Default: no kernels."""
        return False

    def kernel_args(self, layer: nn.Module) -> tuple[torch.Tensor, ...]:
        """The held tensors a kernel and the reference take after x."""
        raise NotImplementedError

    def activations(self, layer: nn.Module) -> str:
        """The layer's activation mode: "dynamic" (W8A8: x quantised at run time; its kernels
        differ) or "weight_only"."""
        return "weight_only"

    def reference(self, activations: str = "weight_only") -> Callable:
        """The reference product (x [M, K], *kernel_args) -> [M, N] in x's dtype, in the
        activation mode `activations`: what every kernel is checked against."""
        raise NotImplementedError

    def kernel_configs(self, n: int, k: int, rows: int, device: torch.device | None = None,
                       activations: str = "weight_only") -> list:
        """The kernel configs (dataclasses) worth timing for a weight [n, k] (K in elements)
        at `rows` rows in the activation mode `activations`."""
        return []

    def kernel(self, config: dict) -> Callable:
        """A kernel with `config` (one of `kernel_configs`, as a dict) bound: (x, *kernel_args)
        -> [M, N]."""
        raise NotImplementedError


def not_convert_entries(value: Any, field: str, where: str) -> tuple[str, ...]:
    """A quantization config's list of module names (None: none).

    Raises:
        CheckpointError: not a list of strings (the message names `where` and `field`).
    """
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{where}: {field} must be a list of module names, got {value!r}")
    return tuple(value)


def expand_rows(stored: torch.Tensor, expand: int, rows: int) -> torch.Tensor:
    """A stored tensor in the held layout: each row repeated `expand` times, the first `rows`
    kept (expand 1: as is; expand 0: a scalar, broadcast by the caller's copy)."""
    if expand == 0:
        return stored.reshape(())
    if expand == 1:
        return stored
    return stored.repeat_interleave(expand, dim=0)[:rows]
