"""Model families in plain PyTorch, chosen by `config.family` (see `dlrt.config`)."""

from __future__ import annotations

import importlib

from torch import nn

from dlrt.config import ModelConfig

_FAMILIES = {
    "sdar": ("dlrt.models.sdar.model", "SDARForCausalLM"),
    "sdar_moe": ("dlrt.models.sdar.model", "SDARForCausalLM"),
    "llada": ("dlrt.models.llada.model", "LLaDAModelLM"),
}


def build_model(config: ModelConfig) -> nn.Module:
    """Construct the family's module tree (call under `torch.device('meta')` to skip init)."""
    module, cls = _FAMILIES[config.family]
    return getattr(importlib.import_module(module), cls)(config)
