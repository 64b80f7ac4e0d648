"""The canvas decoder's dual cache with a vicinity equals dInfer's vicinity refresh.

The reference below transcribes inclusionAI/dInfer `python/dinfer/decoding/generate_uniform.py`
(`BlockRunner.decode` driving `VicinityCacheIteration.forward` with a KV cache that refreshes
on entering a block, no warm-up, batch of one) as a plain PyTorch loop over the test-only
model of `test_canvas_cache` (`FastForward`: Fast-dLLM's `model(x, past_key_values,
replace_position)`); its decoding rule is the one of `test_canvas_cache` (Fast-dLLM's
`get_transfer_index`, temperature 0, quotas or a threshold). A round's window is
[block start - prefix_look, block end + after_look), clipped to the canvas; its tokens are
forwarded at their positions, their K/V replace the cached ones there, and the logits of the
block's rows decide.

fp32 on the CPU, the LM head sharpened as in `test_canvas_cache`.
"""

from __future__ import annotations

import pytest
import torch
from test_canvas_cache import (
    MASK,
    PROMPT_IDS,
    SHARPEN,
    FastForward,
    get_num_transfer_tokens,
    get_transfer_index,
)

from dlrt.errors import OptionError
from dlrt.llm import LLM


def decode(x: torch.Tensor, start: int, end: int, logits: torch.Tensor, quota: torch.Tensor,
           it: int, threshold: float | None) -> int:
    """The decoder's `decode` of the block [start, end) from its logits (its `it`-th call);
    returns the next call's number."""
    block = x[:, start:end]
    mask_index = block == MASK
    if mask_index.any():
        x0, transfer = get_transfer_index(logits, mask_index, block,
                                          quota[:, it] if threshold is None else None, threshold)
        block[transfer] = x0[transfer]
    return it + 1


def dinfer_vicinity(model, prompt: list[int], steps: int, gen_length: int, block_length: int,
                    threshold: float | None, prefix_look: int, after_look: int) -> list[int]:
    """`VicinityCacheDiffusionLLM.generate`: the generated ids."""
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[:, : len(prompt)] = torch.tensor(prompt)
    total_len = x.shape[1]
    steps_per_block = steps // (gen_length // block_length)
    past = None
    for block_start in range(len(prompt), total_len, block_length):
        block_end = block_start + block_length
        quota = get_num_transfer_tokens(x[:, block_start:block_end] == MASK, steps_per_block)
        it = 0
        refreshed = False
        while (x[:, block_start:block_end] == MASK).sum() > 0:
            left_start = max(0, block_start - prefix_look)
            right_end = min(total_len, block_end + after_look)
            if not refreshed:  # the cache is refreshed on entering a block
                logits, past = model(x)
                it = decode(x, block_start, block_end, logits[:, block_start:block_end],
                            quota, it, threshold)
                refreshed = True
            replace = torch.zeros_like(x, dtype=torch.bool)
            replace[:, left_start:right_end] = True
            logits, _ = model(x[:, left_start:right_end], past_key_values=past,
                              replace_position=replace)
            offset = block_start - left_start
            it = decode(x, block_start, block_end, logits[:, offset:offset + block_length],
                        quota, it, threshold)
    return x[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def llm(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32", device="cpu", decoder="canvas")
    llm.model.model.transformer.ff_out.weight.mul_(SHARPEN)
    return llm


def _generate(llm, prompt, b, steps, gen, threshold, before, after):
    strategy = dict(remasking_strategy="low_confidence_static") if threshold is None else \
        dict(remasking_strategy="threshold", threshold=threshold)
    return llm.generate(prompt, max_new_tokens=gen, block_length=b, denoising_steps=steps,
                        canvas_cache="dual", vicinity_before=before, vicinity_after=after,
                        ignore_eos=True, **strategy).token_ids


# (prompt length, block length, steps per block, generation length, threshold): prompts off
# a block boundary (5, 7) and on it (8, 16), the 64-slot canvas padded and filled exactly
# (16 + 48), quotas and thresholds.
CASES = [(5, 4, 4, 12, None), (16, 8, 4, 48, None), (8, 4, 2, 16, None), (7, 8, 8, 24, 0.6)]
VICINITIES = [(0, 0), (2, 0), (0, 3), (4, 4)]


@pytest.mark.parametrize("before,after", VICINITIES)
@pytest.mark.parametrize("p,b,steps,gen,threshold", CASES)
def test_vicinity_matches_dinfer(llm, p, b, steps, gen, threshold, before, after):
    prompt = PROMPT_IDS[:p]
    want = dinfer_vicinity(FastForward(llm), prompt, steps * (gen // b), gen, b, threshold,
                           before, after)
    assert _generate(llm, prompt, b, steps, gen, threshold, before, after) == want


def test_before_is_clipped_to_the_prompt(llm):
    """A prompt shorter than vicinity_before: every window reaches back the prompt's length
    (the first window starts at position 0), one window length for the whole request."""
    prompt = PROMPT_IDS[:3]
    want = dinfer_vicinity(FastForward(llm), prompt, 8, 16, 4, None, 3, 4)
    assert _generate(llm, prompt, 4, 2, 16, None, 6, 4) == want


def test_vicinity_changes_the_decode(llm):
    """The recomputed vicinity is used: some request decodes otherwise than plain dual."""
    dual = _generate(llm, PROMPT_IDS[:5], 4, 4, 24, None, 0, 0)
    assert any(_generate(llm, PROMPT_IDS[:5], 4, 4, 24, None, before, after) != dual
               for before, after in VICINITIES[1:])


@pytest.mark.parametrize("name", ["vicinity_before", "vicinity_after"])
def test_bad_vicinity_is_named(llm, name):
    with pytest.raises(OptionError, match=rf"^{name}=-1 must be in \[0, "):
        llm.generate([1, 2], max_new_tokens=4, canvas_cache="dual", **{name: -1})
    with pytest.raises(OptionError, match=rf"^{name} must be an integer"):
        llm.generate([1, 2], max_new_tokens=4, canvas_cache="dual", **{name: 1.5})
    for cache in ("none", "prefix"):
        with pytest.raises(OptionError, match=rf"^{name}=2 works only with "
                                              rf"canvas_cache='dual', not '{cache}'"):
            llm.generate([1, 2], max_new_tokens=4, canvas_cache=cache, **{name: 2})
    with pytest.raises(OptionError, match=rf"^{name}=2 works only with canvas_cache='dual'"):
        llm.generate([1, 2], max_new_tokens=4, **{name: 2})
    assert llm.generate([1, 2], max_new_tokens=4, **{name: 0}).token_ids
