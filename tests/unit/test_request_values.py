"""A request's values (temperature, top-k, top-p, thresholds, seed, round budget) live in
device memory, so programs and their captured graphs are keyed on kinds, never on values; the
program cache is bounded. (CPU, eager: the keys; the GPU test captures real graphs.)"""

from __future__ import annotations

import pytest

from dlrt import LLM
from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve
from dlrt.runtime.decoder import MAX_PROGRAMS, round_kind

DEFAULTS = DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")
KINDS = [("low_confidence_dynamic", 0.0), ("low_confidence_dynamic", 0.7),
         ("threshold", 0.0), ("dynamic_pmax", 1.1), ("entropy_bounded", 0.9),
         ("credit", 0.0), ("hierarchical", 0.8)]


def params(**options):
    return resolve(DecodingOptions.from_kwargs(options), DEFAULTS, {}, (), 16, 0)


def test_fifty_values_are_one_key_per_kind():
    for strategy, temperature in KINDS:
        keys = {round_kind(params(remasking_strategy=strategy,
                                  temperature=temperature * (1 + i / 50) if temperature else 0,
                                  threshold=0.3 + i / 100, eb_threshold=0.1 + i / 10,
                                  low_threshold=i / 50, credit_weight=i / 10,
                                  credit_boost=i / 25, credit_decay=i / 50,
                                  top_k=20 + i if temperature else 0,
                                  top_p=0.5 + i / 200 if temperature else 1.0, seed=i))
                for i in range(50)}
        assert len(keys) == 1, keys
    kinds = {round_kind(params(remasking_strategy=s, temperature=t)) for s, t in KINDS}
    assert len(kinds) == len(KINDS)
    # the filters that run are part of the kind (their values are not)
    assert len({round_kind(params(temperature=1.0, top_k=k, top_p=p))
                for k in (0, 5) for p in (1.0, 0.9)}) == 4


@pytest.fixture(scope="module")
def llm(tiny_sdar):
    return LLM(tiny_sdar, max_model_len=256)


def test_fifty_requests_share_one_program_and_use_their_own_values(llm, tiny_sdar):
    prompt = list(range(300, 311))
    outs = {}
    for i in range(50):
        t, th = 0.5 + i / 25, 0.05 + i / 60
        outs[i] = llm.generate(prompt, max_new_tokens=4, temperature=t, threshold=th,
                               top_k=40 + i, seed=7).token_ids
    assert len(llm.decoder.programs) == 1
    assert len({tuple(o) for o in outs.values()}) > 1  # the values change the draw
    for i in (0, 17, 49):  # a fresh LLM that saw only this request draws the same tokens
        fresh = LLM(tiny_sdar, max_model_len=256)
        t, th = 0.5 + i / 25, 0.05 + i / 60
        assert fresh.generate(prompt, max_new_tokens=4, temperature=t, threshold=th,
                              top_k=40 + i, seed=7).token_ids == outs[i]


def test_credit_requests_share_one_program_and_use_their_own_values(tiny_sdar):
    """The credit values are read from the block state: one program serves them all, and a
    fresh LLM given one request's values commits what the shared program did."""
    llm = LLM(tiny_sdar, max_model_len=256)
    prompt = list(range(300, 312))
    opts = dict(max_new_tokens=8, block_length=4, temperature=0, remasking_strategy="credit",
                threshold=0.5)
    values = [dict(credit_weight=0.0), dict(credit_weight=100.0, credit_boost=0.0),
              dict(credit_weight=3.0, credit_boost=0.5, credit_decay=1.0)]
    outs = [llm.generate(prompt, **opts, **v) for v in values]
    assert len(llm.decoder.programs) == 1
    rounds = [o.commit_rounds for o in outs]
    # no credit: ~1/V confidences, one per round
    assert sorted(rounds[0][:4]) == sorted(rounds[0][4:]) == [0, 1, 2, 3]
    assert rounds[1] == [0] * 8  # p ** 0 = 1 each round: weight 100 lifts every p to ~1
    fresh = LLM(tiny_sdar, max_model_len=256).generate(prompt, **opts, **values[2])
    assert (fresh.token_ids, fresh.commit_rounds) == (outs[2].token_ids, rounds[2])


def test_program_cache_is_bounded(llm):
    for b in range(1, MAX_PROGRAMS + 4):
        llm.generate([5, 6, 7], max_new_tokens=4, block_length=b, temperature=0)
    programs = llm.decoder.programs
    assert len(programs) == MAX_PROGRAMS
    assert programs[-1].b == MAX_PROGRAMS + 3  # the most recent is kept, the oldest dropped
    assert min(p.b for p in programs) == 4


@pytest.mark.parametrize("strategy", ["threshold", "entropy_bounded"])
def test_an_entropy_budget_past_the_fp32_range_decodes(llm, strategy):
    """eb_threshold is any finite number > 0; past fp32's range it compares like infinity
    (the strategy then commits every masked position), as a Python float would."""
    huge = llm.generate([5, 6, 7], max_new_tokens=8, temperature=0, eb_threshold=1e300,
                        remasking_strategy=strategy)
    inf_like = llm.generate([5, 6, 7], max_new_tokens=8, temperature=0, eb_threshold=3e38,
                            remasking_strategy=strategy)
    assert huge.token_ids == inf_like.token_ids and len(huge.token_ids) == 8
