"""Quantised checkpoints: which format a folder holds, which modules are quantised, and the
`quantization` option (`EngineConfig.quantization`, `make_checkpoint(quantization=...)`),
generic over the registered formats (`dlrt.layers.quant.registry`: each format module says how
a folder declares it, checks its settings and names the modules it leaves unquantised).

A folder's quantization config: the "quantization" object of ModelOpt's `hf_quant_config.json`
when the folder has one, else config.json's `quantization_config`; the format that `reads` it
is the folder's (none: an error naming what was found and what dlrt reads), in the variant
its settings ask for (`QuantFormat.configured`: compressed-tensors FP8's per-tensor scales).

Which modules are quantised: every linear layer and every stack of routed experts, except
  - the LM head (the linear layer `model.logits` calls), unless the checkpoint holds its scale
    (as in the real checkpoints, whose heads stay in BF16);
  - the linear layers a model keeps in its dtype (`keep_unquantized`, not-convert entries:
    DiffusionGemma's router projections);
  - experts stored stacked (`StackedExperts.stacked`: transformers' fused `gate_up_proj` /
    `down_proj`, DiffusionGemma) that a quantised checkpoint holds as those stacked tensors:
    quantisers target linear layers and leave fused experts in the model dtype; quantised,
    they are stored one tensor per expert and part (`experts.{e}.gate_proj.weight`, ...);
  - modules whose checkpoint name matches an entry of the not-convert list: the entry equals
    the name or a run of its dotted segments ("lm_head", "mlp.gate", "model.layers.0"), is
    an fnmatch pattern with "*" matching the whole name, or is a regular expression after
    "re:" matching the name from its start (compressed-tensors' `ignore`: "re:.*mlp.gate$").
Embeddings and norms are never linear layers here, nor are the routers of SDAR-MoE and
LLaDA2, so they stay unquantised. The parts of one merged projection (q/k/v, gate/up) or of one
expert stack must agree.

The option: "auto" (the folder's format, else none), "none" (an unquantised folder; a quantised
folder is an error, as vLLM refuses a quantization that differs from the checkpoint's), a
format's name (the folder's format when it is that one; an unquantised folder is quantised
while it loads, bit-identical to the checkpoint `make_checkpoint(quantization=...)` writes;
another format is an error).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.linear import LinearBase, MergedLinear
from dlrt.layers.moe import StackedExperts
from dlrt.layers.quant import HF_QUANT_CONFIG, QuantFormat
from dlrt.layers.quant.convert import quantize_module
from dlrt.layers.quant.registry import format_names, formats, get_format

log = logging.getLogger(__name__)

def quantizations() -> tuple[str, ...]:
    """The `quantization` option's choices: "auto", "none" and every registered format."""
    return ("auto", "none", *format_names())


@dataclass(frozen=True)
class QuantScheme:
    """How one load quantises: the format, the not-convert entries, whether the weights
    are quantised while loading (`online`) or read quantised from the checkpoint, and the
    format's variant for the checkpoint's settings (`variant`; None: the registered one)."""

    name: str
    not_convert: tuple[str, ...] = ()
    online: bool = False
    variant: QuantFormat | None = None

    @property
    def fmt(self) -> QuantFormat:
        return self.variant if self.variant is not None else get_format(self.name)


def read_scheme(hf_config: dict[str, Any], path: Path | None) -> QuantScheme | None:
    """The format a checkpoint folder holds (None: unquantised).

    Raises:
        CheckpointError: a quantization config no registered format reads (an unknown
            quant_method / quant_algo), or settings its format cannot read (e.g. another FP8
            block size or element format, another NVFP4 group size).
    """
    modelopt = path / HF_QUANT_CONFIG if path is not None else None
    if modelopt is not None and modelopt.is_file():
        try:
            q = json.loads(modelopt.read_text()).get("quantization") or {}
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            raise CheckpointError(f"cannot read {modelopt}: {e}") from e
        where = str(modelopt)
    else:
        q = hf_config.get("quantization_config")
        if q is None:
            return None
        where = f"{path / 'config.json' if path else 'config.json'} quantization_config"
    if not isinstance(q, dict):
        raise CheckpointError(f"{where} is not an object")
    fmt = next((f for f in formats().values() if f.reads(q)), None)
    if fmt is None:
        found = " with ".join(f"{k} {q[k]!r}" for k in ("quant_method", "quant_algo") if k in q)
        raise CheckpointError(f"{where}: {found or 'no quant_method'} is not supported; dlrt "
                              "reads " + ", ".join(f.declared for f in formats().values()))
    skip = fmt.not_convert(q, where)
    variant = fmt.configured(q)
    return QuantScheme(fmt.name, skip, variant=None if variant is fmt else variant)


def resolve_scheme(option: str, hf_config: dict[str, Any], path: Path | None
                   ) -> QuantScheme | None:
    """The scheme of one load for the `quantization` option (see the module docstring).

    Raises:
        OptionError: an unknown option, "none" for a quantised folder, a format other than
            the folder's.
        CheckpointError: as `read_scheme`.
    """
    if option not in quantizations():
        raise OptionError(f"quantization {option!r}: unknown quantization; one of "
                          f"{list(quantizations())}")
    stored = read_scheme(hf_config, path)
    if option == "auto":
        return stored
    if option == "none":
        if stored is not None:
            raise OptionError(f"{path} holds {stored.name} weights (its quantization config); "
                              f"load it with quantization='auto' or '{stored.name}' (dlrt "
                              "does not dequantise a quantised checkpoint at load)")
        return None
    if stored is None:
        return QuantScheme(option, online=True)
    if stored.name != option:
        raise OptionError(f"{path} holds {stored.name} weights; quantization={option!r} "
                          f"does not match: use 'auto' or '{stored.name}'")
    return stored


def head_names(model: nn.Module, hidden: int) -> set[str]:
    """The linear layers `model.logits` calls (traced on the meta device)."""
    called: set[str] = set()
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: called.add(n))
             for n, m in model.named_modules() if isinstance(m, LinearBase)]
    try:
        with torch.no_grad():
            model.logits(torch.empty(1, hidden, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    return called


def matches(name: str, entries: tuple[str, ...]) -> bool:
    """Whether a module's checkpoint name matches a not-convert entry."""
    for e in entries:
        if e.startswith("re:"):
            if re.match(e[3:], name):
                return True
        elif "*" in e or "?" in e:
            if fnmatch.fnmatchcase(name, e):
                return True
        elif f".{e}." in f".{name}.":
            return True
    return False


def _checkpoint_names(name: str, module: nn.Module) -> list[str]:
    if isinstance(module, MergedLinear):
        parent = name.rpartition(".")[0]
        return [f"{parent}.{part}" for part, _ in module.parts]
    if isinstance(module, StackedExperts):
        return [f"{name}.{e}.{p}" for e in range(module.num_experts)
                for p in ("gate_proj", "up_proj", "down_proj")]
    return [name]


def kept_names(model: nn.Module) -> list[str]:
    """The checkpoint names of the linear layers `model` keeps in its dtype under every
    quantisation (its `keep_unquantized` entries), in module order."""
    keep = tuple(getattr(model, "keep_unquantized", ()))
    return [n for name, m in model.named_modules() if isinstance(m, LinearBase)
            for n in _checkpoint_names(name, m) if keep and matches(n, keep)]


def _stored_stacked(name: str, module: nn.Module, scheme: QuantScheme,
                    tensor_names: set[str] | frozenset[str]) -> bool:
    """Whether `module` is stacked experts that a quantised checkpoint stores stacked (one
    tensor over its experts, in the model dtype: left by a quantiser of linear layers)."""
    return (isinstance(module, StackedExperts) and module.stacked and not scheme.online
            and f"{name}.{StackedExperts.STACKED['w13']}" in tensor_names)


def quantize_model(model: nn.Module, hidden: int, scheme: QuantScheme,
                   tensor_names: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Convert the modules the scheme quantises (model on the meta device); return their names.
    `tensor_names`: the checkpoint's tensors (a head is quantised only if it holds its scale;
    stacked experts only if it does not hold them stacked).

    Raises:
        CheckpointError: the parts of one merged projection or expert stack disagree about
            being converted, or a weight's shape does not fit the format.
        OptionError: quantising while loading or writing (`scheme.online`) a module the
            format cannot hold (a weight's shape).
    """
    fmt = scheme.fmt
    heads = head_names(model, hidden)
    keep = tuple(getattr(model, "keep_unquantized", ()))
    scale = f".{fmt.suffixes[1]}"
    done = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, (LinearBase, StackedExperts)):
            continue
        names = _checkpoint_names(name, module)
        if name in heads and (scheme.online or not all(n + scale in tensor_names
                                                       for n in names)):
            continue
        if keep and all(matches(n, keep) for n in names) \
                or _stored_stacked(name, module, scheme, tensor_names):
            continue
        skipped = [matches(n, scheme.not_convert) for n in names]
        if all(skipped):
            continue
        if any(skipped):
            raise CheckpointError(f"the not-convert list of the quantization config covers "
                                  f"some parts of {name} but not all ({names}); dlrt "
                                  "quantises merged projections and expert stacks as a whole")
        try:
            quantize_module(module, fmt)
        except ValueError as e:
            if scheme.online:  # the option asks for what this model cannot hold
                raise OptionError(f"quantization={scheme.name!r}: {name}: {e}; this model runs "
                                  "unquantised (quantization 'none')") from e
            raise CheckpointError(f"{name}: {e}") from e
        done.append(name)
    return done


def quantize_for_writing(model: nn.Module, hidden: int, name: str
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Convert a model (meta) to write a checkpoint in format `name` (all but the LM head and
    the layers the model keeps unquantised); return its config entries (`config_entries`, the
    heads and those layers as the not-convert list)."""
    heads = sorted(head_names(model, hidden))
    quantize_model(model, hidden, QuantScheme(name, online=True))
    return config_entries(name, heads + kept_names(model))


def config_entries(name: str, not_convert: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json `quantization_config`, extra JSON files by name) of a checkpoint written in
    format `name` (`make_checkpoint`): the format's own (`QuantFormat.checkpoint_config`)."""
    return get_format(name).checkpoint_config(not_convert)
