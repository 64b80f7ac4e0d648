"""Decoder registry: the block loops by name, with their default options. Which family a
decoder fits is the decoder's own answer (`DecoderBase.supports`); the registry asks it."""

from __future__ import annotations

import dataclasses
import importlib

from dlrt.decoding.options import DecoderDefaults
from dlrt.errors import OptionError
from dlrt.models.family import Family

# name -> (module, class, defaults). block_length None = one block over the whole generation.
DECODERS = {
    "block": ("dlrt.runtime.block_decoder", "BlockDecoder",
              DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")),
    "canvas": ("dlrt.runtime.canvas_decoder", "CanvasDecoder",
               DecoderDefaults(block_length=None, remasking_strategy="low_confidence_static")),
    "dllm_var": ("dlrt.runtime.lookahead_decoder", "LookaheadDecoder",
                 DecoderDefaults(block_length=64, remasking_strategy="low_confidence_dynamic")),
    # renoising (uniform-state) families: no mask token, no strategy; the canvas is the model's
    "renoise": ("dlrt.runtime.renoise_decoder", "RenoiseDecoder",
                DecoderDefaults(block_length=None, remasking_strategy="sequential",
                                renoise=True)),
}


def decoder_class(name: str) -> type:
    """The class of decoder `name` (its module imported on first use).

    Raises:
        OptionError: unknown decoder.
    """
    if name not in DECODERS:
        raise OptionError(f"unknown decoder {name!r}; one of {sorted(DECODERS)}")
    module, cls, _ = DECODERS[name]
    return getattr(importlib.import_module(module), cls)


def decoder_for(family: Family, name: str | None,
                trained_block: int | None) -> tuple[str, DecoderDefaults]:
    """Resolve the decoder name (None: the family's default) and its defaults: the family's
    own (`Family.decoder_defaults`) when it has them and the decoder is its default, else the
    decoder's; the "block" decoder takes the block length the model was trained with
    (`trained_block`, the config's `block_size`) over either.

    Raises:
        OptionError: unknown decoder, or one that does not fit the family (the decoder's
            reason, and the decoders that fit); or, when the family's default decoder is not
            in `DECODERS` (its own decoder, not built yet), any other that does not fit it
            (the message names the missing one).
    """
    name = name or family.default_decoder
    own = family.default_decoder
    if own not in DECODERS:
        fits = _fitting(family)
        if name not in fits:
            raise OptionError(f"{family.name} models need their own decoder, {own!r}, which is "
                              "not available yet; " + (f"use one of {fits}" if fits else
                                                       f"none of {sorted(DECODERS)} fits them"))
    why = decoder_class(name).supports(family)
    if why is not None:
        raise OptionError(f"{why}; use one of {_fitting(family)}")
    defaults: DecoderDefaults = DECODERS[name][2]
    if family.decoder_defaults is not None and name == family.default_decoder:
        defaults = family.decoder_defaults
    if name == "block" and trained_block:
        defaults = dataclasses.replace(defaults, block_length=trained_block)
    return name, defaults


def _fitting(family: Family) -> list[str]:
    return [n for n in sorted(DECODERS) if decoder_class(n).supports(family) is None]


def build_decoder(name: str, runner, mask_token_id: int, defaults: DecoderDefaults, executor):
    """An instance of decoder `name` (imported on first use)."""
    return decoder_class(name)(runner, mask_token_id, defaults, executor)
