"""Model families by `model_type`: one line per family (`FAMILIES`), looked up here only."""

from __future__ import annotations

from typing import Any

from torch import nn

from dlrt.errors import ConfigError
from dlrt.models.config import ModelConfig
from dlrt.models.diffusion_gemma import DIFFUSION_GEMMA
from dlrt.models.family import Family
from dlrt.models.llada import LLADA
from dlrt.models.llada2 import LLADA2
from dlrt.models.llada_moe import LLADA_MOE
from dlrt.models.sdar import SDAR, SDAR_MOE

FAMILIES: tuple[Family, ...] = (SDAR, SDAR_MOE, LLADA, LLADA_MOE, LLADA2, DIFFUSION_GEMMA)


def family(name: str) -> Family:
    """The record of family `name` (a `ModelConfig.family`)."""
    return next(f for f in FAMILIES if f.name == name)


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a raw config dict: by `model_type`, or, when there is none, by
    `architectures`. A `model_type` that several families serve ("llada": LLaDA and
    LLaDA-MoE) goes to the one whose architecture the config names, else to the first.

    Raises:
        ConfigError: the `model_type` names no supported family (or, with no `model_type`,
            neither do the `architectures`).
    """
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    served = [fam for fam in FAMILIES if model_type in fam.model_types]
    for fam in served:
        if any(arch in fam.architectures for arch in archs):
            return fam
    if served:
        return served[0]
    if model_type is None:  # only a config without model_type is read by its architectures
        for arch in archs:
            for fam in FAMILIES:
                if arch in fam.architectures:
                    return fam
    supported = sorted({t for fam in FAMILIES for t in fam.model_types})
    raise ConfigError(f"unknown model_type {model_type!r} (architectures "
                      f"{hf.get('architectures')}); supported: {supported}")


def model_config(hf: dict[str, Any]) -> ModelConfig:
    """Normalise a raw `config.json` dict with its family's normaliser.

    Raises:
        ConfigError: unknown family, a missing required field, a field of the wrong type or
            out of range (the message names it and its value), or an unsupported feature.
    """
    fam = family_of(hf)
    return fam.normalise(hf, fam.name)


def build_model(config: ModelConfig, ops) -> nn.Module:
    """Construct the family's module tree with the ops table `ops` (call under
    `torch.device('meta')` to skip initialisation)."""
    return family(config.family).model(config, ops)
