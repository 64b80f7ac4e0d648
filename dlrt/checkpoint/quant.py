"""Quantised checkpoints: which format a folder holds, which modules are quantised, and the
`quantization` option (`EngineConfig.quantization`, `make_checkpoint(quantization=...)`).

Formats read from a folder:
  "fp8": config.json `quantization_config` {"quant_method": "fp8", "fmt": "e4m3",
      "weight_block_size": [128, 128], "activation_scheme": "dynamic", optional
      "modules_to_not_convert" (or "ignored_layers")} (Qwen3-*-FP8, DeepSeek-V3);
      tensors: `dlrt.layers.quant.fp8`.
  "nvfp4": ModelOpt's export, `hf_quant_config.json` {"quantization": {"quant_algo": "NVFP4",
      "group_size": 16, "exclude_modules": [...]}} and/or config.json `quantization_config`
      {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": [...]};
      tensors: `dlrt.layers.quant.nvfp4`.

Which modules are quantised: every linear layer and every stack of routed experts, except
  - the LM head (the linear layer `model.logits` calls), unless the checkpoint holds its scale
    (as in the real checkpoints, whose heads stay in BF16);
  - modules whose checkpoint name matches an entry of the not-convert list: the entry equals
    the name or a run of its dotted segments ("lm_head", "mlp.gate", "model.layers.0"), or is
    an fnmatch pattern with "*" matching the whole name.
Embeddings, norms and routers are never linear layers here, so they stay unquantised. The
parts of one merged projection (q/k/v, gate/up) or of one expert stack must agree.

The option: "auto" (the folder's format, else none), "none" (an unquantised folder; a quantised
folder is an error, as vLLM refuses a quantization that differs from the checkpoint's), "fp8" /
"nvfp4" (the folder's format when it is that one; an unquantised folder is quantised while it
loads, bit-identical to the checkpoint `make_checkpoint(quantization=...)` writes; another
format is an error).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.linear import LinearBase, MergedLinear
from dlrt.layers.moe import StackedExperts
from dlrt.layers.quant import QuantFormat
from dlrt.layers.quant.convert import quantize_module
from dlrt.layers.quant.fp8 import BLOCK, FP8_FORMAT

log = logging.getLogger(__name__)

QUANTIZATIONS = ("auto", "none", "fp8", "nvfp4")
HF_QUANT_CONFIG = "hf_quant_config.json"


def _formats() -> dict[str, QuantFormat]:
    from dlrt.layers.quant.nvfp4 import NVFP4_FORMAT

    return {"fp8": FP8_FORMAT, "nvfp4": NVFP4_FORMAT}


@dataclass(frozen=True)
class QuantScheme:
    """How one load quantises: the format, the not-convert entries, and whether the weights
    are quantised while loading (`online`) or read quantised from the checkpoint."""

    name: str
    not_convert: tuple[str, ...] = ()
    online: bool = False

    @property
    def fmt(self) -> QuantFormat:
        return _formats()[self.name]


def _entries(value: Any, field: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{where}: {field} must be a list of module names, got {value!r}")
    return tuple(value)


def _fp8_scheme(q: dict[str, Any], where: str) -> QuantScheme:
    block = q.get("weight_block_size")
    if block != [BLOCK, BLOCK]:
        raise CheckpointError(f"{where}: fp8 weight_block_size {block!r} is not supported; dlrt "
                              f"reads block-scaled FP8 with weight_block_size [{BLOCK}, {BLOCK}]")
    if q.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(f"{where}: fp8 fmt {q.get('fmt')!r} is not supported (e4m3 only)")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise CheckpointError(f"{where}: fp8 activation_scheme {q.get('activation_scheme')!r} "
                              "is not supported; dlrt reads block-scaled FP8 with dynamic "
                              "activations (per token and 128-column group; or weight-only "
                              "with fp8_activations='weight_only')")
    skip = q.get("ignored_layers", q.get("modules_to_not_convert"))
    return QuantScheme("fp8", _entries(skip, "modules_to_not_convert", where))


def _nvfp4_scheme(q: dict[str, Any], where: str) -> QuantScheme:
    group = q.get("group_size")
    if group is None:
        groups = q.get("config_groups") or {}
        group = next((g.get("weights", {}).get("group_size") for g in groups.values()
                      if isinstance(g, dict)), 16)
    if group != 16:
        raise CheckpointError(f"{where}: NVFP4 group_size {group!r} is not supported (16 only)")
    skip = q.get("exclude_modules", q.get("ignore"))
    return QuantScheme("nvfp4", _entries(skip, "exclude_modules", where))


def read_scheme(hf_config: dict[str, Any], path: Path | None) -> QuantScheme | None:
    """The format a checkpoint folder holds (None: unquantised).

    Raises:
        CheckpointError: an unknown quant_method / quant_algo, or settings dlrt cannot read
            (another FP8 block size or element format, another NVFP4 group size).
    """
    modelopt = path / HF_QUANT_CONFIG if path is not None else None
    if modelopt is not None and modelopt.is_file():
        try:
            q = json.loads(modelopt.read_text()).get("quantization") or {}
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            raise CheckpointError(f"cannot read {modelopt}: {e}") from e
        return _algo_scheme(q, str(modelopt))
    q = hf_config.get("quantization_config")
    if q is None:
        return None
    where = f"{path / 'config.json' if path else 'config.json'} quantization_config"
    if not isinstance(q, dict):
        raise CheckpointError(f"{where} is not an object")
    method = q.get("quant_method")
    if method == "fp8":
        return _fp8_scheme(q, where)
    if method == "modelopt" or (method is None and "quant_algo" in q):
        return _algo_scheme(q, where)
    raise CheckpointError(f"{where}: quant_method {method!r} is not supported; dlrt reads "
                          "'fp8' (block-scaled, 128x128) and ModelOpt NVFP4 ('modelopt' with "
                          "quant_algo 'NVFP4')")


def _algo_scheme(q: dict[str, Any], where: str) -> QuantScheme:
    algo = q.get("quant_algo")
    if algo == "NVFP4":
        return _nvfp4_scheme(q, where)
    raise CheckpointError(f"{where}: quant_algo {algo!r} is not supported; dlrt reads 'NVFP4'")


def resolve_scheme(option: str, hf_config: dict[str, Any], path: Path | None
                   ) -> QuantScheme | None:
    """The scheme of one load for the `quantization` option (see the module docstring).

    Raises:
        OptionError: an unknown option, "none" for a quantised folder, a format other than
            the folder's.
        CheckpointError: as `read_scheme`.
    """
    if option not in QUANTIZATIONS:
        raise OptionError(f"quantization {option!r}: unknown quantization; one of "
                          f"{list(QUANTIZATIONS)}")
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
        if "*" in e or "?" in e:
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


def quantize_model(model: nn.Module, hidden: int, scheme: QuantScheme,
                   tensor_names: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Convert the modules the scheme quantises (model on the meta device); return their names.
    `tensor_names`: the checkpoint's tensors (a head is quantised only if it holds its scale).

    Raises:
        CheckpointError: the parts of one merged projection or expert stack disagree about
            being converted, or a weight's shape does not fit the format.
    """
    fmt = scheme.fmt
    heads = head_names(model, hidden)
    scale = f".{fmt.suffixes[1]}"
    done = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, (LinearBase, StackedExperts)):
            continue
        names = _checkpoint_names(name, module)
        if name in heads and (scheme.online or not all(n + scale in tensor_names
                                                       for n in names)):
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
            raise CheckpointError(f"{name}: {e}") from e
        done.append(name)
    return done


def quantize_for_writing(model: nn.Module, hidden: int, name: str
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Convert a model (meta) to write a checkpoint in format `name` (all but the LM head);
    return its config entries (`config_entries`, the heads as the not-convert list)."""
    heads = sorted(head_names(model, hidden))
    quantize_model(model, hidden, QuantScheme(name, online=True))
    return config_entries(name, heads)


def config_entries(name: str, not_convert: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json `quantization_config`, extra JSON files by name) of a checkpoint written in
    format `name` (`make_checkpoint`)."""
    if name == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK],
                "modules_to_not_convert": not_convert}, {}
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
             "exclude_modules": not_convert}
    producer = {"name": "modelopt", "version": "dlrt"}
    config = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": producer,
              "ignore": not_convert,
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}}}}
    return config, {HF_QUANT_CONFIG: {"producer": producer, "quantization": quant}}
