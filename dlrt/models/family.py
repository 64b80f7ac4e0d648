"""What a model family is, in one record: everything outside `models/<family>/` that depends on
the family reads it from here (`dlrt.models.registry` looks records up by `model_type`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from dlrt.decoding.options import DecoderDefaults
from dlrt.models.config import ModelConfig


@dataclass(frozen=True)
class Family:
    """One model family.

    name: `ModelConfig.family`.
    model_types: `config.json` `model_type` values it serves; `architectures`: the class names
        that identify it when a config has no `model_type`.
    normalise(hf config dict, name) -> ModelConfig (raises ConfigError naming the field).
    model(config, ops) -> nn.Module: the plain-PyTorch model (build it on the meta device).
    decoders: the decoders that fit the family; the first is the default.
    stop_ids: stop ids the family's decoding adds to `generation_config.json`'s.
    with_layers(hf, n) -> hf: the config reduced to its first n layers (make-checkpoint).
    tokenizer: folder under `dlrt/data` whose tokenizer a made checkpoint gets when its source
        has none (None: no tokenizer).
    embedding: name of the token-embedding parameter (a round reads only B rows of it).
    decoder_defaults: the family's own decoding defaults for its default decoder (None: the
        decoder's).
    supports_editing: whether the model was trained to rewrite decided tokens (LLaDA2.1's
        editing, `editing_threshold`).
    tp_plan: how tensor parallelism cuts the linear layers that are not inside a `SwiGLU` or
        `FusedMoE` (those are cut by type): (module-name pattern (fnmatch), kind) pairs, kind
        "heads" (the fused QKV projection: the rank's query and KV heads), "column" (the
        rank's rows of each part), "row" (the rank's input columns; the output is summed
        over the ranks) or "vocab" (the LM head: the rank's vocabulary rows). See
        `dlrt.distributed.transform`.
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    normalise: Callable[[dict[str, Any], str], ModelConfig]
    model: Callable[..., nn.Module]
    decoders: tuple[str, ...]
    with_layers: Callable[[dict[str, Any], int], dict[str, Any]]
    embedding: str
    stop_ids: tuple[int, ...] = ()
    tokenizer: str | None = None
    decoder_defaults: DecoderDefaults | None = None
    supports_editing: bool = False
    tp_plan: tuple[tuple[str, str], ...] = ()

    @property
    def default_decoder(self) -> str:
        return self.decoders[0]
