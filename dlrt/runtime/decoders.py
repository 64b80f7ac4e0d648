"""Decoder registry: which block loop serves a family, with its default options."""

from __future__ import annotations

from dlrt.decoding.options import DecoderDefaults
from dlrt.errors import OptionError

# name -> (module, class, defaults). block_length None = one block over the whole generation.
DECODERS = {
    "block": ("dlrt.runtime.block_decoder", "BlockDecoder",
              DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")),
    "canvas": ("dlrt.runtime.canvas_decoder", "CanvasDecoder",
               DecoderDefaults(block_length=None, remasking_strategy="low_confidence_static")),
    "dllm_var": ("dlrt.runtime.lookahead_decoder", "LookaheadDecoder",
                 DecoderDefaults(block_length=64, remasking_strategy="low_confidence_dynamic")),
}
FAMILY_DECODER = {"sdar": "block", "sdar_moe": "block", "llada": "canvas"}
# Stop ids a family's decoders add to generation_config's: LLaDA-Instruct ends a turn with
# <|eot_id|> (126348) and pads with <|endoftext|> (126081).
FAMILY_STOP_IDS = {"llada": (126081, 126348)}
COMPATIBLE = {"sdar": {"block"}, "sdar_moe": {"block"}, "llada": {"canvas", "dllm_var"}}


def decoder_for(family: str, name: str | None,
                trained_block: int | None) -> tuple[str, DecoderDefaults]:
    """Resolve the decoder name and its defaults for a family.

    Raises:
        OptionError: unknown decoder, or one that does not fit the family.
    """
    name = name or FAMILY_DECODER[family]
    if name not in DECODERS:
        raise OptionError(f"unknown decoder {name!r}; one of {sorted(DECODERS)}")
    if name not in COMPATIBLE[family]:
        raise OptionError(f"decoder {name!r} does not fit a {family} model; "
                          f"use one of {sorted(COMPATIBLE[family])}")
    defaults = DECODERS[name][2]
    if name == "block" and trained_block:
        defaults = DecoderDefaults(trained_block, defaults.remasking_strategy)
    return name, defaults
