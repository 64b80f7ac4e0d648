"""The mask token is never output, and non-finite logits are a named error.

A tiny model whose LM head makes the mask token every position's argmax (a large logit added
to its column) decodes to other tokens and finishes normally: greedy and sampled, SDAR's block
decoder (plain and credit), LLaDA's canvas and dLLM-Var; the round function never commits or
edits it. A NaN weight in the LM head raises `NumericalError` from `LLM.generate` instead of
decoding garbage, read once per block with the tokens."""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingSpec
from dlrt.decoding.strategies import StrategySpec
from dlrt.errors import NumericalError

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    return LLM(tiny_sdar, device="cpu")


@pytest.fixture(scope="module", params=["canvas", "dllm_var"])
def llada(tiny_llada, request):
    return LLM(tiny_llada, device="cpu", decoder=request.param)


def force_mask_top(monkeypatch, llm: LLM) -> int:
    """Make the mask token every position's top logit, by far."""
    mask, logits = llm.config.mask_token_id, llm.model.logits

    def forced(hidden):
        out = logits(hidden)
        out[:, mask] = out.max() + 1000.0
        return out

    monkeypatch.setattr(llm.model, "logits", forced)
    return mask


SDAR_CASES = [dict(), dict(temperature=1.0, top_k=50, top_p=0.9, seed=3),
              dict(remasking_strategy="credit"), dict(remasking_strategy="entropy_bounded")]


@pytest.mark.parametrize("options", SDAR_CASES, ids=["greedy", "sampled", "credit", "entropy"])
def test_sdar_never_outputs_the_mask_token(sdar, monkeypatch, options):
    mask = force_mask_top(monkeypatch, sdar)
    out = sdar.generate(PROMPT, max_new_tokens=9, block_length=4, **options)
    assert mask not in out.token_ids and len(out.token_ids) == 9
    assert out.finish_reason == "length"


@pytest.mark.parametrize("options", SDAR_CASES[:2], ids=["greedy", "sampled"])
def test_llada_never_outputs_the_mask_token(llada, monkeypatch, options):
    mask = force_mask_top(monkeypatch, llada)
    out = llada.generate(PROMPT, max_new_tokens=8, block_length=4, **options)
    assert mask not in out.token_ids and len(out.token_ids) == 8
    assert out.finish_reason == "length"


def test_the_round_never_commits_or_edits_the_mask_token():
    mask = 3
    logits = torch.zeros(4, 8)
    logits[:, mask] = 50.0
    logits[:, 5] = 1.0
    spec = RoundSpec(StrategySpec("threshold", 0.0, 0.0), SamplingSpec(0.0, 0, 1.0, 0), 4,
                     editing_threshold=0.0, mask_token_id=mask)
    tokens = torch.tensor([1, 2, mask, mask])
    masked = torch.tensor([False, False, True, True])
    new, still, _ = denoise_round(spec, logits, tokens, masked, torch.arange(4), 0, 1,
                                  editable=torch.ones(4, dtype=torch.bool))
    assert new.tolist() == [5, 5, 5, 5] and not still.any()


def generate_with_a_nan_weight(llm: LLM, head: torch.nn.Module, **options):
    with torch.no_grad():
        keep = head.weight[11, 0].clone()
        head.weight[11, 0] = float("nan")
        try:
            with pytest.raises(NumericalError, match="non-finite logits"):
                llm.generate(PROMPT, max_new_tokens=8, block_length=4, **options)
        finally:
            head.weight[11, 0] = keep
    assert llm.generate(PROMPT, max_new_tokens=4, block_length=4).finish_reason == "length"


@pytest.mark.parametrize("options", [dict(), dict(temperature=0.8)], ids=["greedy", "sampled"])
def test_non_finite_logits_raise_numerical_error_sdar(sdar, options):
    generate_with_a_nan_weight(sdar, sdar.model.lm_head, **options)


def test_non_finite_logits_raise_numerical_error_llada(llada):
    generate_with_a_nan_weight(llada, llada.model.model.transformer.ff_out)


def test_mask_token_that_is_an_end_of_text_id_is_refused(tiny_sdar, tiny_llada):
    """The mask token is never committed, so a mask id among the eos ids could never stop a
    generation: a named OptionError before the weights load."""
    from dlrt.errors import OptionError

    for path in (tiny_sdar, tiny_llada):
        eos = LLM(path, device="cpu", load_format="dummy").engine.eos_token_ids
        with pytest.raises(OptionError, match=f"mask_token_id={eos[0]} is an end-of-text id"):
            LLM(path, device="cpu", mask_token_id=eos[0])
