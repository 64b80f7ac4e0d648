"""Options a request sets that change nothing in it get one warning naming them: strategy
values of strategies that do not read them, sampling filters at temperature 0, the post-step
limit without token editing. Defaults never warn, nor do values that turn a filter off."""

from __future__ import annotations

import logging

import pytest

from dlrt.decoding.ignored import ignored_options
from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve

DEFAULTS = DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")
LOGGER = "dlrt.decoding.ignored"


def ignored(gen=None, defaults=DEFAULTS, **kwargs) -> list[str]:
    opts = DecodingOptions.from_kwargs(kwargs)
    params = resolve(opts, defaults, gen or {}, (0,), 16, 7)
    return list(ignored_options(opts, params))


@pytest.mark.parametrize("kwargs, names", [
    # sampling filters at temperature 0 (greedy: the argmax of the plain softmax)
    (dict(top_k=5), ["top_k"]),
    (dict(top_p=0.9, temperature=0), ["top_p"]),
    (dict(top_k=5, top_p=0.9, temperature=0.7), []),
    (dict(top_k=0, top_p=1.0), []),  # the values that turn the filters off ask for nothing
    # the strategies' values
    (dict(remasking_strategy="sequential", threshold=0.5), ["threshold"]),
    (dict(remasking_strategy="low_confidence_static", threshold=0.5), ["threshold"]),
    (dict(remasking_strategy="random", threshold=0.5), ["threshold"]),
    (dict(remasking_strategy="entropy_bounded", threshold=0.5, eb_threshold=0.5), ["threshold"]),
    (dict(remasking_strategy="threshold", threshold=0.5, eb_threshold=0.5), ["eb_threshold"]),
    (dict(threshold=0.5), []),  # the decoder's low_confidence_dynamic reads it
    (dict(remasking_strategy="dynamic_pmax", threshold=0.5, low_threshold=0.2),
     ["low_threshold"]),
    (dict(remasking_strategy="hierarchical", threshold=0.5, low_threshold=0.2), []),
    (dict(credit_weight=1.0, credit_boost=0.5, credit_decay=0.5),
     ["credit_weight", "credit_boost", "credit_decay"]),
    (dict(remasking_strategy="credit", threshold=0.5, credit_weight=1.0, credit_boost=0.5,
          credit_decay=0.5), []),
    # the post passes exist only with token editing
    (dict(max_post_steps=4), ["max_post_steps"]),
    (dict(max_post_steps=4, editing_threshold=0.9), []),
    # what always acts
    (dict(max_new_tokens=8, block_length=2, denoising_steps=1, seed=3, stop=["x"],
          ignore_eos=True, remasking_strategy="threshold", temperature=0), []),
])
def test_what_has_no_effect(kwargs, names):
    assert ignored(**kwargs) == names


def test_defaults_never_count():
    """Values that come from the decoder or generation_config.json are not the request's: a
    checkpoint that samples with top_k 20 and a request at temperature 0 warns of nothing; a
    family that edits by default reads a max_post_steps the request sets."""
    assert ignored(gen={"do_sample": True, "temperature": 0.6, "top_k": 20},
                   temperature=0) == []
    assert ignored(gen={"do_sample": True, "temperature": 0.6}, top_k=20) == []
    editing = DecoderDefaults(block_length=4, remasking_strategy="threshold",
                              editing_threshold=0.9)
    assert ignored(defaults=editing, max_post_steps=2) == []
    assert ignored() == []


def test_one_warning_per_request_naming_each_option(tiny_sdar, caplog):
    from dlrt import LLM

    llm = LLM(tiny_sdar, dtype="float32")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        llm.generate([1, 2, 3], max_new_tokens=4, temperature=0, top_k=5, top_p=0.5,
                     remasking_strategy="sequential", threshold=0.3)
        mine = [r for r in caplog.records if r.name == LOGGER]
        assert len(mine) == 1, [r.getMessage() for r in mine]
        text = mine[0].getMessage()
        for part in ("top_k=5", "top_p=0.5", "threshold=0.3", "temperature 0",
                     "sequential"):
            assert part in text, text
        list(llm.stream([1, 2, 3], max_new_tokens=8, max_post_steps=3))
        mine = [r for r in caplog.records if r.name == LOGGER]
        assert len(mine) == 2 and "max_post_steps=3" in mine[1].getMessage()
        llm.generate([1, 2, 3], max_new_tokens=4, temperature=0.7, top_k=5, seed=1)
        llm.check([1, 2, 3], top_k=5)  # a check alone is not a request
        assert len([r for r in caplog.records if r.name == LOGGER]) == 2
