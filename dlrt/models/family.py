"""What a model family is, in one record: everything outside `models/<family>/` that depends on
the family reads it from here (`dlrt.models.registry` looks records up by `model_type`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from dlrt.decoding.options import DecoderDefaults
from dlrt.models.config import ModelConfig


@dataclass(frozen=True)
class RoundWeights:
    """Where the persistent round (`dlrt.runtime.persistent`) finds a dense model's weights:
    parameter paths of the built model, "{layer}" standing for a layer's index (`at`).

    embedding: the token embedding [V, H]; qkv: the merged q/k/v projection [(Hq + 2 Hkv) D, H];
    o: [H, Hq D]; gate_up: the merged gate and up projection [2 I, H] (gate rows first); down:
    [H, I]; lm_head: [V, H]; input_norm / post_norm: the RMSNorm weights before the attention
    and the MLP [H]; q_norm / k_norm: the per-head RMSNorm weights [D]; final_norm: before the
    LM head [H]. rotary: the module path of the RoPE tables (`cos_sin(positions)`, `inv_freq`,
    `full_precision`: `dlrt.layers.rotary.RotaryEmbedding`).
    """

    embedding: str
    qkv: str
    o: str
    gate_up: str
    down: str
    lm_head: str
    input_norm: str
    post_norm: str
    q_norm: str
    k_norm: str
    final_norm: str
    rotary: str

    def at(self, name: str, layer: int) -> str:
        """The path of weight `name` (a field) in layer `layer`."""
        return getattr(self, name).format(layer=layer)


@dataclass(frozen=True)
class Family:
    """One model family.

    name: `ModelConfig.family`.
    model_types: `config.json` `model_type` values it serves; `architectures`: the class names
        that identify it when a config has no `model_type`.
    normalise(hf config dict, name) -> ModelConfig (raises ConfigError naming the field).
    model(config, ops) -> nn.Module: the plain-PyTorch model (build it on the meta device).
    default_decoder: the decoder used when none is asked for (`dlrt.runtime.decoders`; which
        decoders fit the family is each decoder's answer, from `attention`). A name not in
        `DECODERS` is the family's own decoder, not built yet: asking for the family's model
        raises OptionError naming it, unless another decoder fits.
    attention: the attention pattern the model was trained with: "block_causal" (SDAR,
        LLaDA2: bidirectional inside a block, causal across blocks), "full" (LLaDA: every
        position sees every other) or "encoder_decoder" (DiffusionGemma: causal encoder
        passes write the cache, a bidirectional canvas reads it).
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
    round_weights: the persistent round's weight paths (`RoundWeights`); None: the
        persistent round does not serve the family.
    check_prompt(config, prompt ids): raises PromptError for a prompt the model as built
        cannot take (DiffusionGemma: image input); None: any ids of the vocabulary.
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    normalise: Callable[[dict[str, Any], str], ModelConfig]
    model: Callable[..., nn.Module]
    default_decoder: str
    with_layers: Callable[[dict[str, Any], int], dict[str, Any]]
    embedding: str
    attention: str = "block_causal"
    stop_ids: tuple[int, ...] = ()
    tokenizer: str | None = None
    decoder_defaults: DecoderDefaults | None = None
    supports_editing: bool = False
    tp_plan: tuple[tuple[str, str], ...] = ()
    round_weights: RoundWeights | None = None
    check_prompt: Callable[[ModelConfig, Sequence[int]], None] | None = None
