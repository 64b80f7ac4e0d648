"""Iteration smoothing over the canvas decoder's approximate KV caches equals dInfer's loops.

The reference (`smoothing_reference.dinfer_cached`) transcribes dInfer's `IterationSmooth`
with its prefix / dual cache and `IterSmoothWithVicinityCache` (dual with prefix_look /
after_look) over `test_canvas_cache.FastForward` (LLaDA from dlrt's weights with Fast-dLLM's
past-K/V interface, taking input embeddings). The refresh forward adds the soft embeddings of
every canvas position and leaves new ones for all of them; a window forward adds those of its
positions and leaves new ones for them only. Tokens must be equal in eager mode and in the
host_loop mode run on the CPU (`cpu_graph_modes.simulate`: captured parts replayed as
calls after the executor's warm-up).

fp32 on the CPU, the LM head sharpened as in `test_canvas_cache`.
"""

from __future__ import annotations

import pytest
from cpu_graph_modes import simulate
from smoothing_reference import Smooth, dinfer_cached
from test_canvas_cache import MASK, PROMPT_IDS, SHARPEN, FastForward

from dlrt.llm import LLM


@pytest.fixture(scope="module")
def llm(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32", device="cpu", decoder="canvas")
    llm.model.model.transformer.ff_out.weight.mul_(SHARPEN)
    return llm


def _generate(llm, prompt, b, gen, cache, before, after, smooth: Smooth):
    return llm.generate(prompt, max_new_tokens=gen, block_length=b, denoising_steps=b,
                        canvas_cache=cache, vicinity_before=before, vicinity_after=after,
                        ignore_eos=True, **smooth.options()).token_ids


def _reference(llm, prompt, b, gen, cache, before, after, smooth: Smooth):
    return dinfer_cached(FastForward(llm), llm.model.model.transformer.wte.weight, prompt,
                         gen, b, cache, before, after, smooth, MASK)


CAPPED = dict(cont_weight=0.5, cont_weight_init=0.2, cont_weight_growth=0.1,
              threshold_decay=0.05)
# (cache, before, after, prompt length, block length, generation length, threshold, values):
# canvases padded (5 + 24, 7 + 24) and filled exactly (16 + 48, the 64-slot canvas), prompts
# on and off a block boundary, one sub-block over the generation; dInfer's defaults and
# values whose weight reaches its cap and whose bar reaches the threshold.
CASES = [
    ("prefix", 0, 0, 5, 8, 24, 0.6, {}),
    ("prefix", 0, 0, 16, 16, 48, 0.7, CAPPED),
    ("dual", 0, 0, 5, 8, 24, 0.6, {}),
    ("dual", 0, 0, 16, 8, 48, 0.5, CAPPED),
    ("dual", 4, 4, 16, 8, 48, 0.6, {}),
    ("dual", 2, 0, 7, 8, 24, 0.7, CAPPED),
    ("dual", 0, 3, 5, 24, 24, 0.6, {}),
]


@pytest.mark.parametrize("mode", ["eager", "host_loop"])
@pytest.mark.parametrize("cache,before,after,p,b,gen,threshold,values", CASES)
def test_cached_smoothing_matches_dinfer(llm, monkeypatch, mode, cache, before, after, p, b,
                                         gen, threshold, values):
    prompt, smooth = PROMPT_IDS[:p], Smooth(threshold, **values)
    want = _reference(llm, prompt, b, gen, cache, before, after, smooth)
    if mode != "eager":
        simulate(llm.executor, mode, monkeypatch)
    try:
        assert _generate(llm, prompt, b, gen, cache, before, after, smooth) == want
    finally:
        llm.executor._graphs.clear()


@pytest.mark.parametrize("strategy", ["credit", "hierarchical"])
@pytest.mark.parametrize("cache,before,after,p,b,gen,threshold,values",
                         [CASES[0], CASES[4]])
def test_cached_smoothing_commits_with_dinfer_s_other_decoders(
        llm, strategy, cache, before, after, p, b, gen, threshold, values):
    prompt, smooth = PROMPT_IDS[:p], Smooth(threshold, strategy, **values)
    want = _reference(llm, prompt, b, gen, cache, before, after, smooth)
    assert _generate(llm, prompt, b, gen, cache, before, after, smooth) == want


def test_the_soft_embeddings_are_used_over_the_caches(llm):
    """Every cache decodes some request otherwise with the weights at 0 (the bar still
    decays): the refresh's and the windows' soft embeddings reach the forwards."""
    off = dict(cont_weight=0.0, cont_weight_init=0.0)
    for cache, before, after in (("prefix", 0, 0), ("dual", 0, 0), ("dual", 4, 4)):
        assert any(
            _generate(llm, PROMPT_IDS[:p], b, gen, cache, before, after, Smooth(t, **v))
            != _generate(llm, PROMPT_IDS[:p], b, gen, cache, before, after,
                         Smooth(t, **{**v, **off}))
            for _, _, _, p, b, gen, t, v in CASES[:4]), cache


def test_one_program_per_kind_and_values_on_the_device(llm):
    """Smoothing is part of the program's key (its own buffers), never its values."""
    _generate(llm, PROMPT_IDS[:5], 8, 24, "dual", 0, 0, Smooth(0.6))
    prog = llm.decoder.programs[-1]
    assert prog.smoothing is not None
    _generate(llm, PROMPT_IDS[:5], 8, 24, "dual", 0, 0, Smooth(0.3, **CAPPED))
    assert llm.decoder.programs[-1] is prog
    llm.generate(PROMPT_IDS[:5], max_new_tokens=24, block_length=8, ignore_eos=True,
                 canvas_cache="dual", remasking_strategy="threshold", threshold=0.6)
    assert llm.decoder.programs[-1] is not prog and llm.decoder.programs[-1].smoothing is None
