"""Per-layer FP8 KV-cache scales from a checkpoint (the vLLM / ModelOpt convention).

An FP8 KV cache (`kv_cache_dtype="fp8"`) stores K / k_scale and V / v_scale in e4m3 and reads
stored * scale, one fp32 scale for the keys and one for the values of each layer. A checkpoint
calibrated for it holds them as scalar tensors (shape [] or [1]) beside the layer's attention
projections: `<attention>.k_scale` and `<attention>.v_scale` (as vLLM and compressed-tensors
name them: `model.layers.{i}.self_attn.k_scale` in SDAR), or `<attention>.k_proj.k_scale` and
`<attention>.v_proj.v_scale` (ModelOpt's exports), where `<attention>` is the module that holds
the layer's `Attention` (LLaDA2: `model.layers.{i}.attention`; LLaDA:
`model.transformer.blocks.{i}`). A checkpoint with none of them gets 1.0 for every layer;
one with the scales of some layers only is refused. The weights loader leaves these tensors
to this module.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.errors import CheckpointError
from dlrt.layers.attention import Attention

SUFFIXES = ("k_scale", "v_scale")


def is_kv_scale(name: str) -> bool:
    """Whether checkpoint tensor `name` is a KV-cache scale (read here, not by the loader)."""
    return name.rpartition(".")[2] in SUFFIXES


def kv_scale_names(model: nn.Module) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per layer (in layer order): the names its k scale may have, and its v scale's."""
    owners = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            owners[module.layer_id] = name.rpartition(".")[0]
    return [((f"{o}.k_scale", f"{o}.k_proj.k_scale"), (f"{o}.v_scale", f"{o}.v_proj.v_scale"))
            for o in (owners[i] for i in sorted(owners))]


def read_kv_scales(model: nn.Module, folder: CheckpointFolder
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(k_scale [L], v_scale [L]) fp32 on the CPU from the checkpoint, or None when it holds
    no KV-cache scale.

    Raises:
        CheckpointError: scales for some layers (or only K, or only V) but not all; a scale
            that is not a positive finite scalar; an unreadable file.
    """
    from safetensors import SafetensorError, safe_open

    def get(name: str) -> torch.Tensor:
        try:
            with safe_open(folder.tensor_files[name], framework="pt", device="cpu") as f:
                return f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read {name} from {folder.tensor_files[name]}: "
                                  f"{e}") from e

    return kv_scales_from(model, folder.tensor_files, get, f"checkpoint {folder.path}")


def kv_scales_from(model: nn.Module, names, get, where: str
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`read_kv_scales` over any tensors: `names` (a container of the tensor names held),
    `get(name)` -> the tensor; `where` names them in errors.

    Raises:
        CheckpointError: as `read_kv_scales`.
    """
    names_kv = kv_scale_names(model)
    found = [[next((n for n in options if n in names), None) for options in kv]
             for kv in names_kv]
    present = [n for kv in found for n in kv if n is not None]
    if not present:
        return None
    missing = [options[0] for kv, got in zip(names_kv, found, strict=True)
               for options, n in zip(kv, got, strict=True) if n is None]
    if missing:
        raise CheckpointError(f"{where} holds KV-cache scales for some layers "
                              f"but lacks {missing[:4]}{' ...' if len(missing) > 4 else ''}: "
                              "an FP8 KV cache needs k_scale and v_scale for every layer")
    values = []
    for name in present:
        t = get(name)
        if t.numel() != 1 or t.dim() > 1 or not t.is_floating_point():
            raise CheckpointError(f"KV-cache scale {name} must be a float scalar ([] or [1]), "
                                  f"got {t.dtype} {list(t.shape)}")
        value = float(t.float())
        if not 0 < value < float("inf"):
            raise CheckpointError(f"KV-cache scale {name} is {value}: it must be positive and "
                                  "finite")
        values.append(value)
    scales = torch.tensor(values, dtype=torch.float32).view(-1, 2)
    return scales[:, 0].contiguous(), scales[:, 1].contiguous()
