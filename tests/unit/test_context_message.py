"""A request past the context says how many of the positions it needs are padding (LLaDA's
canvas: whole sub-blocks and a canvas of a multiple of 64 positions), so the user can see why
prompt + max_new_tokens alone would have fit."""

from __future__ import annotations

import pytest

from dlrt import LLM
from dlrt.errors import PromptError


def test_the_llada_context_check_names_the_canvas_padding(tiny_llada):
    llm = LLM(tiny_llada, device="cpu", max_model_len=100)
    # 30 + 60 = 90 fit; two sub-blocks of 32 make 94, the canvas 128: 38 are padding
    with pytest.raises(PromptError, match=r"needs 128 positions \(38 of them canvas padding: "
                                          r".*block_length.*multiple of 64.*context of 100"):
        llm.check(list(range(1, 31)), max_new_tokens=60, block_length=32)
    llm.check(list(range(1, 31)), max_new_tokens=10, block_length=10)  # 40 -> 64 fits


def test_the_block_decoder_names_its_padding(tiny_sdar):
    llm = LLM(tiny_sdar, device="cpu", max_model_len=32)
    with pytest.raises(PromptError, match=r"needs 36 positions \(3 of them padding: the last "
                                          r"block is filled to block_length\)"):
        llm.check(list(range(1, 11)), max_new_tokens=23, block_length=4)
