"""In-place weight updates of a loaded model (`LLM.update_weights`, an RL loop's new policy).

The weights come by the names of the family's Hugging Face checkpoint, as a trainer's
`state_dict()` has them: a mapping or an iterable of (name, tensor), a `torch.nn.Module` (its
`state_dict()`: a transformers model of the family), or a checkpoint
folder (safetensors only, `CheckpointFolder`). They reach the parameters through the
loader's own map (`dlrt.checkpoint.loader.weight_specs`, `fill`): merged projections (QKV,
gate-up) and stacked experts take their row ranges, a tensor-parallel rank its slice of each
full tensor, and a quantised module its format's tensors, made from the high-precision weight
by the format's own quantiser (`QuantFormat.quantize`, as online quantisation loads) unless
the weights hold the format's scales too (a quantised folder: read as stored). Experts also
take transformers' fused names (`<experts>.gate_up_proj` [E, 2I, H], `<experts>.down_proj`
[E, H, I]). A tied parameter takes any of its names (`lm_head.weight` of a model whose head
is its embedding); tensors that share storage (a state_dict's tied entries) count as one.

`plan_update` checks everything before anything is copied: names the model does not have
(unknown), names it needs that are missing (with `strict`, or when every weight must come:
`complete`), tensors of the wrong shape, and tensors whose dtype cannot be cast: any
floating-point dtype is cast to the parameter's (a bf16 trainer into an fp32 engine), but
integer, bool and complex tensors, float8 tensors for an unquantised module, and a quantised
folder's tensors not in their format's stored dtype are refused. Every problem is listed in
one `WeightsError`. `Update.apply` then copies (`param.data.copy_`: the storage and its
address stay, so captured graphs and the persistent round's pointers stay valid).

Ignored as the loader ignores them: static activation scales (`input_scale`), the parts the
model does not serve (`checkpoint_skips`), other ranks' experts. KV-cache scales (`k_scale`,
`v_scale`, every layer's) are returned (`Update.kv_scales`) for an FP8 cache to take.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.kv_scales import is_kv_scale, kv_scales_from
from dlrt.checkpoint.loader import (
    WeightSpec,
    dtype_problem,
    fill,
    other_ranks_experts,
    shape_problem,
    weight_specs,
)
from dlrt.errors import CheckpointError, WeightsError
from dlrt.layers.moe import StackedExperts

SHOWN = 8  # names listed per kind of problem in an error
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
           "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class _Piece:
    """A tensor read as a safetensors slice is: its shape, and indexing."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index) -> torch.Tensor:
        return self.tensor[index]


class TensorSource:
    """Tensors in memory by checkpoint name, read as an open safetensors file is (`fill`).
    `rename` maps a name the model reads to the name it was given under (a tied alias)."""

    def __init__(self, tensors: dict[str, torch.Tensor], where: str):
        self.tensors, self.where = tensors, where
        self.rename: dict[str, str] = {}

    @property
    def names(self) -> set[str]:
        return set(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors[name].dtype

    def shared(self) -> list[set[str]]:
        """Groups of two or more names whose tensors are one storage (tied entries)."""
        groups: dict[tuple, set[str]] = {}
        for name, t in self.tensors.items():
            if t.numel():
                key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(),
                       tuple(t.shape), t.stride(), t.dtype)
                groups.setdefault(key, set()).add(name)
        return [g for g in groups.values() if len(g) > 1]

    def get_slice(self, name: str) -> _Piece:
        return _Piece(self.tensors[self.rename.get(name, name)])

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.tensors[self.rename.get(name, name)]

    def close(self) -> None:
        pass


class FolderSource(TensorSource):
    """The safetensors files of a checkpoint folder, each opened once (mmap); shapes and
    dtypes come from their headers, tensors are read when copied."""

    def __init__(self, folder: CheckpointFolder):
        from safetensors import safe_open

        self.folder, self.where = folder, str(folder.path)
        self.rename = {}
        self._stack = contextlib.ExitStack()
        self._files = {}
        try:
            for path in sorted(set(folder.tensor_files.values())):
                self._files[path] = self._stack.enter_context(
                    safe_open(path, framework="pt", device="cpu"))
        except Exception as e:
            self._stack.close()
            raise CheckpointError(f"cannot read {path} (truncated or corrupt?): {e}") from e

    def _file(self, name: str):
        return self._files[self.folder.tensor_files[self.rename.get(name, name)]]

    @property
    def names(self) -> set[str]:
        return set(self.folder.tensor_files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        code = self._file(name).get_slice(name).get_dtype()
        return _DTYPES.get(code, torch.complex64)  # (an unlisted code: refused as not float)

    def shared(self) -> list[set[str]]:
        return []

    def get_slice(self, name: str):
        return self._file(name).get_slice(self.rename.get(name, name))

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(self.rename.get(name, name))

    def close(self) -> None:
        self._stack.close()


def open_source(weights: Any) -> TensorSource:
    """The `TensorSource` of what `LLM.update_weights` takes (see the module docstring).

    Raises:
        WeightsError: not one of those, a name that is not a str, a value that is not a
            tensor (or a meta tensor), a name given twice.
        CheckpointError, OptionError: a folder that cannot be read (`CheckpointFolder.open`).
    """
    if isinstance(weights, (str, os.PathLike)):
        return FolderSource(CheckpointFolder.open(weights))
    if isinstance(weights, nn.Module):
        # NOTE: its persistent buffers too: some checkpoints store weights as buffers
        # (transformers' DiffusionGemma `layer_scalar`)
        items = list(weights.state_dict().items())
        where = f"the state_dict of a {type(weights).__name__}"
    elif isinstance(weights, Mapping):
        items, where = list(weights.items()), "the weights given"
    elif isinstance(weights, Iterable) and not isinstance(weights, (bytes, torch.Tensor)):
        items, where = list(weights), "the weights given"
    else:
        raise WeightsError(f"weights must be a mapping or an iterable of (name, tensor), a "
                           f"torch.nn.Module or a checkpoint folder; got "
                           f"{type(weights).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    twice = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise WeightsError(f"weights: expected (name, tensor) pairs, got {item!r:.80}")
        name, t = item
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise WeightsError(f"weights: {name!r:.80} -> {type(t).__name__}: names are str "
                               "and values torch.Tensor")
        if t.is_meta:
            raise WeightsError(f"weights: {name!r:.80} is a meta tensor (no data); nothing "
                               "was updated")
        if name in tensors:
            twice.append(name)
        tensors[name] = t.detach()
    if twice:
        raise WeightsError(f"weights: {_listed(twice)} given twice")
    return TensorSource(tensors, where)


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return f"{names[:SHOWN]}{more}"


@dataclasses.dataclass
class Update:
    """A checked update (`plan_update`): its specs read from `source`, and the KV-cache
    scales it holds ((k [L], v [L]) fp32, or None)."""

    specs: list[WeightSpec]
    source: TensorSource
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None

    def apply(self, model: nn.Module) -> int:
        """Copy every tensor into its parameter; the number of checkpoint tensors copied.

        Raises:
            WeightsError: a copy failed (an unreadable file): the model's weights are partly
                updated, and the message says so.
        """
        params = dict(model.named_parameters())
        done = [0]
        try:
            with torch.no_grad():
                fill(params, self.source, self.specs, self.source.where,
                     lambda n: done.__setitem__(0, done[0] + n))
        except Exception as e:
            raise WeightsError(f"copying the weights from {self.source.where} failed after "
                               f"{done[0]} of {len(self.specs)} tensors ({e}); the weights are "
                               "partly updated: update them again, or reload") from e
        finally:
            self.close()
        return done[0]

    def close(self) -> None:
        """Close the source's files (a folder's); `apply` does."""
        self.source.close()


def _tied_names(model: nn.Module, keys: set[str]) -> dict[str, list[str]]:
    """Each checkpoint key of a tied parameter (its first name) -> its other names."""
    first: dict[int, str] = {}
    out: dict[str, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in first:
            first[id(p)] = name
        elif first[id(p)] in keys:
            out.setdefault(first[id(p)], []).append(name)
    return out


def _specs(model: nn.Module, given: set[str]) -> list[WeightSpec]:
    """The specs the weights given fit: experts by transformers' fused names where those are
    given; a quantised module's stored tensors where its scales are given (a quantised
    folder), else its high-precision weight quantised."""
    fused = frozenset(name for name, m in model.named_modules()
                      if isinstance(m, StackedExperts) and not m.stacked
                      and f"{name}.{StackedExperts.STACKED['w13']}" in given)
    stored = weight_specs(model, online=False, stacked=fused)
    scales = [s for s in stored if s.dtype is not None and s.suffix != "weight"]
    if any(s.key in given for s in scales):
        return stored
    return weight_specs(model, online=True, stacked=fused)


def plan_update(model: nn.Module, source: TensorSource, strict: bool = True,
                complete: bool = False) -> Update:
    """Check `source` against `model` (see the module docstring) and return the update.

    Args:
        strict: a tensor the model needs and `source` lacks is an error (else it keeps its
            value). complete: every tensor must come, whatever `strict` (weights dropped by
            `sleep(level=2)` have no value to keep).
    Raises:
        WeightsError: listing the unknown names, the missing ones, the wrong shapes and the
            dtypes that cannot be cast.
    """
    given = source.names
    specs = _specs(model, given)
    keys = {s.read_key for s in specs}
    tied = _tied_names(model, keys)
    for key, others in tied.items():
        if key not in given:
            alias = next((n for n in others if n in given), None)
            if alias is not None:
                source.rename[key] = alias
    used = {source.rename.get(k, k) for k in keys}
    accepted = used | {n for others in tied.values() for n in others if n in given}
    skips = tuple(getattr(model, "checkpoint_skips", ()))
    accepted |= {n for n in given if is_kv_scale(n) or n.endswith(".input_scale")
                 or (skips and n.startswith(skips))}
    accepted |= other_ranks_experts(model, given)
    for group in source.shared():
        if group & accepted:
            accepted |= group
    unknown = sorted(given - accepted)
    missing = sorted({k for k in keys if source.rename.get(k, k) not in given}) \
        if strict or complete else []
    params = dict(model.named_parameters())
    problems, seen = [], set()
    for s in specs:
        if source.rename.get(s.read_key, s.read_key) not in given or s.read_key in seen:
            continue
        seen.add(s.read_key)
        name = source.rename.get(s.read_key, s.read_key)
        p = shape_problem(s, source.shape(name), source.where) \
            or dtype_problem(s, source.dtype(name), source.where, params[s.param].dtype)
        if p:
            problems.append(p)
    for key, others in tied.items():
        want = next(s for s in specs if s.read_key == key)
        for n in others:
            if n in given and (p := shape_problem(dataclasses.replace(want, key=n),
                                                  source.shape(n), source.where)):
                problems.append(p)
    kv_scales = None
    try:
        kv_scales = kv_scales_from(model, given, source.get_tensor, source.where)
    except CheckpointError as e:
        problems.append(str(e))
    if unknown or missing or problems:
        parts = []
        if unknown:
            parts.append(f"names the model does not have: {_listed(unknown)}")
        if missing:
            why = "every weight must be given after sleep(level=2)" if complete and not strict \
                else "strict=True"
            parts.append(f"missing ({why}): {_listed(missing)}")
        parts += problems[:SHOWN]
        if len(problems) > SHOWN:
            parts.append(f"and {len(problems) - SHOWN} more wrong shapes or dtypes")
        source.close()
        raise WeightsError(f"update_weights from {source.where}: nothing was updated: "
                           + "; ".join(parts))
    specs = [s for s in specs if source.rename.get(s.read_key, s.read_key) in given]
    return Update(specs, source, kv_scales)


def portable(weights: Any) -> str | dict[str, torch.Tensor]:
    """`weights` as another process can receive them (pickled): a folder as its path, other
    weights as a dict of CPU tensors (tensors that shared storage still do).

    Raises:
        WeightsError: as `open_source`.
    """
    if isinstance(weights, (str, os.PathLike)):
        return str(Path(weights))
    source = open_source(weights)
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, t in source.tensors.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               t.stride(), t.dtype) if t.numel() else (name,)
        if key not in copies:
            copies[key] = t.cpu()
        out[name] = copies[key]
    return out
