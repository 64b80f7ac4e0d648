"""Fill a model built on the meta device: from safetensors (mmap, one copy) or seeded random.

A parameter maps to one checkpoint tensor of the same name, except stacked MoE experts
(`...mlp.experts.w13` [E, 2I, H]), which gather `...mlp.experts.{e}.gate_proj.weight` and
`...up_proj.weight` (`StackedExperts.checkpoint_parts`), and merged projections
(`MergedLinear`, e.g. `...self_attn.qkv_proj.weight`), whose row ranges are filled by
`...self_attn.q_proj.weight`, `...k_proj.weight`, `...v_proj.weight`.
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.errors import CheckpointError
from dlrt.layers.linear import MergedLinear
from dlrt.layers.moe import StackedExperts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightSpec:
    """Checkpoint tensor `key` fills `param[index]` (or the whole `param` when index is None):
    a row range of a merged projection (slice) or of one stacked expert ((e, slice))."""

    key: str
    param: str
    index: slice | tuple[int, slice] | None
    shape: tuple[int, ...]


def weight_specs(model: nn.Module) -> list[WeightSpec]:
    """Every checkpoint tensor the model needs, in parameter order."""
    modules = dict(model.named_modules())
    specs = []
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        if isinstance(module, MergedLinear):
            parent = owner.rpartition(".")[0]
            for part, lo, hi in module.ranges():
                specs.append(WeightSpec(f"{parent}.{part}.{leaf}", name, slice(lo, hi),
                                        (hi - lo, *p.shape[1:])))
        elif isinstance(module, StackedExperts):
            for e in range(p.shape[0]):
                for part, rows in module.checkpoint_parts(leaf):
                    specs.append(WeightSpec(f"{owner}.{e}.{part}", name, (e, rows),
                                            (rows.stop - rows.start, *p.shape[2:])))
        else:
            specs.append(WeightSpec(name, name, None, tuple(p.shape)))
    return specs


def materialize(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Replace meta parameters by uninitialised tensors on `device` (ties kept); move buffers.
    Parameters a module names in its `fp32_params` (a router's) are fp32 whatever `dtype`."""
    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        fp32 = getattr(module, "fp32_params", ())
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                t = torch.float32 if name in fp32 else dtype
                done[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=t, device=device),
                                           requires_grad=False)
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to(device)


def load_safetensors(model: nn.Module, folder: CheckpointFolder) -> None:
    """Copy checkpoint tensors into the (materialised) parameters of `model`.

    Raises:
        CheckpointError: a tensor is missing, its shape differs from the model's, or a
            safetensors file is unreadable (truncated, corrupt).
    """
    from safetensors import SafetensorError

    params = dict(model.named_parameters())
    specs = weight_specs(model)
    missing = [s.key for s in specs if s.key not in folder.tensor_files]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint {folder.path} lacks tensor(s) {missing[:5]}{more}")
    by_file: dict[Path, list[WeightSpec]] = defaultdict(list)
    for s in specs:
        by_file[folder.tensor_files[s.key]].append(s)
    for path, file_specs in by_file.items():
        try:
            _load_file(params, path, file_specs)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read {path} (truncated or corrupt?): {e}") from e
    unused = set(folder.tensor_files) - {s.key for s in specs}
    if unused:
        log.warning("ignored %d checkpoint tensor(s) the model does not use, e.g. %s",
                    len(unused), sorted(unused)[:3])


def _load_file(params: dict[str, nn.Parameter], path: Path, specs: list[WeightSpec]) -> None:
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for s in specs:
            shape = tuple(f.get_slice(s.key).get_shape())
            if shape != s.shape:
                raise CheckpointError(f"tensor {s.key} in {path.name} has shape {list(shape)}, "
                                      f"the model expects {list(s.shape)}")
            dst = params[s.param].data
            (dst if s.index is None else dst[s.index]).copy_(f.get_tensor(s.key))


def tensor_seed(seed: int, key: str) -> int:
    """Seed of one tensor: independent of shard layout and loading order."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)


# Checkpoint tensors (by last name) stored in fp32 whatever the model dtype, and the 1-D
# tensors that are not norm weights: LLaDA2's router bias `<mlp>.gate.expert_bias` [E].
FP32_TENSORS = ("expert_bias",)


def stored_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a checkpoint holds tensor `key` in when its weights are in `dtype`."""
    return torch.float32 if key.rpartition(".")[2] in FP32_TENSORS else dtype


def random_tensor(spec: WeightSpec, seed: int, std: float, dtype: torch.dtype,
                  device: torch.device | str) -> torch.Tensor:
    """The seeded random value of one checkpoint tensor: norms (1-D) are ones, the rest
    (router biases included: a uniform bias would change no choice) normal(0, std), drawn in
    fp32 on `device` and cast to `dtype`."""
    if len(spec.shape) == 1 and spec.key.rpartition(".")[2] not in FP32_TENSORS:
        return torch.ones(spec.shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, spec.key))
    t = torch.empty(spec.shape, dtype=torch.float32, device=device)
    return t.normal_(0.0, std, generator=gen).to(dtype)


def init_dummy(model: nn.Module, seed: int, std: float) -> None:
    """Fill materialised parameters with the values `make_checkpoint` would write."""
    params = dict(model.named_parameters())
    for s in weight_specs(model):
        dst = params[s.param].data
        value = random_tensor(s, seed, std, dst.dtype, dst.device)
        (dst if s.index is None else dst[s.index]).copy_(value)
