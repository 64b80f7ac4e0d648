"""`DecodingOptions.from_kwargs` and `resolve`: names, types, ranges, defaults, stop ids."""

from __future__ import annotations

import pytest

from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve
from dlrt.errors import OptionError

DEFAULTS = DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")
EOS = (151645, 151643)
SAMPLE_GEN = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def params(gen=None, defaults=DEFAULTS, eos=EOS, **kwargs):
    return resolve(DecodingOptions.from_kwargs(kwargs), defaults, gen or {}, eos,
                   default_max_new_tokens=128, random_seed=77)


# --- names and types --------------------------------------------------------------------------

def test_unknown_options_are_named():
    with pytest.raises(OptionError) as e:
        DecodingOptions.from_kwargs({"block_length": 4, "tempreature": 0.5, "bogus": 1})
    assert "tempreature" in str(e.value) and "bogus" in str(e.value)
    named = str(e.value).split("; known")[0]
    assert "block_length" not in named and "tempreature" in named


@pytest.mark.parametrize("name, value", [
    ("max_new_tokens", "16"),
    ("block_length", "4"),
    ("block_length", True),
    ("denoising_steps", 2.0),
    ("top_k", False),
    ("seed", 1.5),
    ("temperature", "0.5"),
    ("temperature", True),
    ("threshold", [0.9]),
    ("threshold", 10**400),
    ("top_p", "1"),
    ("eb_threshold", "x"),
    ("low_threshold", "0.4"),
    ("credit_weight", True),
    ("credit_boost", [0.2]),
    ("credit_decay", "0.8"),
    ("editing_threshold", "0.5"),
    ("editing_threshold", True),
    ("max_post_steps", 1.5),
    ("max_post_steps", True),
    ("max_post_steps", "3"),
    ("remasking_strategy", 3),
    ("ignore_eos", "yes"),
])
def test_bad_types_name_the_field(name, value):
    with pytest.raises(OptionError, match=name):
        DecodingOptions.from_kwargs({name: value})


@pytest.mark.parametrize("stop", [[1.5], [True], [""], {1, 2}, 3.0, [None]])
def test_bad_stop_entries(stop):
    with pytest.raises(OptionError, match="stop"):
        DecodingOptions.from_kwargs({"stop": stop})


def test_none_means_default_and_numbers_accept_ints():
    opts = DecodingOptions.from_kwargs({"max_new_tokens": None, "temperature": 1, "top_p": 1})
    assert opts.max_new_tokens is None
    p = params(max_new_tokens=None, temperature=1, top_p=1)
    assert p.max_new_tokens == 128
    assert p.sampling.temperature == 1.0 and isinstance(p.sampling.temperature, float)


# --- ranges -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("block_length", 0),
    ("block_length", -4),
    ("denoising_steps", 0),
    ("denoising_steps", 2**63),
    ("threshold", -0.1),
    ("threshold", 1.1),
    ("eb_threshold", 0),
    ("eb_threshold", -1.0),
    ("low_threshold", -0.1), ("low_threshold", 1.5), ("low_threshold", float("nan")),
    ("credit_weight", -0.5), ("credit_weight", 101), ("credit_weight", float("inf")),
    ("credit_weight", float("nan")),
    ("credit_boost", -1e-3), ("credit_boost", float("inf")), ("credit_boost", float("nan")),
    ("credit_decay", -0.1), ("credit_decay", 1.01), ("credit_decay", float("nan")),
    ("editing_threshold", -0.1),
    ("editing_threshold", 1.5),
    ("editing_threshold", float("nan")),
    ("threshold", float("nan")),
    ("max_post_steps", -1),
    ("max_post_steps", 1025), ("max_post_steps", 2**62),
    ("temperature", -1),
    ("top_k", -1),
    ("top_p", 0),
    ("top_p", 1.5),
    ("max_new_tokens", 0),
    ("seed", -1),
    ("seed", 2**63),
    ("remasking_strategy", "fastest"),
])
def test_out_of_range_names_the_field(name, value):
    with pytest.raises(OptionError) as e:
        params(**{name: value})
    assert str(e.value).startswith(name), str(e.value)
    assert repr(value) in str(e.value) or repr(float(value)) in str(e.value)


@pytest.mark.parametrize("name, value", [
    ("threshold", 0.0), ("threshold", 1.0), ("top_p", 1.0), ("top_k", 0), ("temperature", 0),
    ("max_new_tokens", 1), ("block_length", 1), ("denoising_steps", 1), ("seed", 0),
    ("seed", 2**63 - 1), ("denoising_steps", 2**63 - 1), ("editing_threshold", 0.0),
    ("editing_threshold", 1.0), ("max_post_steps", 0), ("max_post_steps", 1024),
    ("low_threshold", 0.0), ("low_threshold", 1.0), ("credit_weight", 0), ("credit_weight", 100),
    ("credit_boost", 0), ("credit_boost", 1e6), ("credit_decay", 0), ("credit_decay", 1),
    ("temperature", 1e-6), ("temperature", 1e6), ("credit_boost", 3.4e38),
])
def test_range_boundaries_accepted(name, value):
    params(**{name: value})


# --- defaults ---------------------------------------------------------------------------------

def test_defaults_without_generation_config_are_greedy():
    p = params()
    assert (p.max_new_tokens, p.block_length, p.denoising_steps) == (128, 4, 4)
    assert p.strategy.name == "low_confidence_dynamic"
    assert (p.strategy.threshold, p.strategy.eb_threshold) == (0.9, 0.35)
    assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.0, 0, 1.0)
    assert p.sampling.seed == 77
    assert p.stop_token_ids == frozenset(EOS) and p.stop_strings == ()
    assert (p.editing_threshold, p.max_post_steps) == (None, 16)  # no edits
    # dInfer's: HierarchyDecoder's low_threshold, CreditThresholdParallelDecoder's credit
    assert p.strategy.low_threshold == 0.4
    assert (p.strategy.credit_weight, p.strategy.credit_boost, p.strategy.credit_decay) == \
        (0.7, 0.2, 0.8)


def test_dinfer_strategy_values_are_resolved():
    p = params(remasking_strategy="credit", threshold=0.8, credit_weight=1, credit_boost=0.5,
               credit_decay=0.0)
    s = p.strategy
    assert (s.name, s.threshold, s.credit_weight, s.credit_boost, s.credit_decay) == \
        ("credit", 0.8, 1.0, 0.5, 0.0)
    assert isinstance(s.credit_weight, float)
    p = params(remasking_strategy="hierarchical", threshold=0.92, low_threshold=0.62)
    assert (p.strategy.name, p.strategy.threshold, p.strategy.low_threshold) == \
        ("hierarchical", 0.92, 0.62)


def test_editing_defaults_come_from_the_decoder_defaults():
    edits = DecoderDefaults(32, "threshold", threshold=0.95, editing_threshold=0.5,
                            max_post_steps=4)
    p = params(defaults=edits)
    assert (p.block_length, p.strategy.threshold, p.editing_threshold, p.max_post_steps) == \
        (32, 0.95, 0.5, 4)
    p = params(defaults=edits, editing_threshold=0, max_post_steps=0)
    assert (p.editing_threshold, p.max_post_steps) == (0.0, 0)
    assert isinstance(p.editing_threshold, float)


def test_sampling_defaults_from_generation_config_when_do_sample():
    p = params(gen=SAMPLE_GEN)
    assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.6, 20, 0.95)
    # request values win over the checkpoint's
    p = params(gen=SAMPLE_GEN, temperature=0, top_k=5, top_p=0.5)
    assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.0, 5, 0.5)
    # do_sample with missing fields: those fall back to off
    p = params(gen={"do_sample": True, "temperature": 0.8})
    assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.8, 0, 1.0)


def test_generation_config_ignored_without_do_sample():
    for gen in ({**SAMPLE_GEN, "do_sample": False},
                {k: v for k, v in SAMPLE_GEN.items() if k != "do_sample"}):
        p = params(gen=gen)
        assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.0, 0, 1.0)


@pytest.mark.parametrize("name, value", [
    ("temperature", -3), ("temperature", float("nan")), ("temperature", "0.6"),
    ("top_k", -1), ("top_k", 2.5), ("top_p", 0), ("top_p", 1.5), ("top_p", True),
])
def test_bad_sampling_default_from_generation_config_says_so(name, value):
    with pytest.raises(OptionError) as e:
        params(gen={**SAMPLE_GEN, name: value})
    msg = str(e.value)
    assert msg.startswith(f"generation_config.json: {name}={value!r} "), msg
    assert "default" in msg, msg
    # a request that sets the option does not use the file's value
    params(gen={**SAMPLE_GEN, name: value}, **{name: {"top_k": 1}.get(name, 0.5)})


def test_block_steps_and_strategy_defaults():
    p = params(block_length=8)
    assert (p.block_length, p.denoising_steps) == (8, 8)
    p = params(block_length=8, denoising_steps=3, remasking_strategy="threshold",
               threshold=0.5, eb_threshold=1.0, seed=3, max_new_tokens=10)
    assert (p.block_length, p.denoising_steps, p.max_new_tokens) == (8, 3, 10)
    assert (p.strategy.name, p.strategy.threshold, p.strategy.eb_threshold) == \
        ("threshold", 0.5, 1.0)
    assert p.sampling.seed == 3
    # a decoder without a block length: one block over the whole generation
    canvas = DecoderDefaults(block_length=None, remasking_strategy="low_confidence_static")
    p = params(defaults=canvas, max_new_tokens=24)
    assert (p.block_length, p.denoising_steps, p.strategy.name) == \
        (24, 24, "low_confidence_static")


# --- stop ids and strings ---------------------------------------------------------------------

def test_eos_ids_are_stop_ids_unless_ignore_eos():
    assert params(stop=[7]).stop_token_ids == frozenset({7, *EOS})
    assert params(stop=[7], ignore_eos=True).stop_token_ids == frozenset({7})
    assert params(ignore_eos=True).stop_token_ids == frozenset()


def test_stop_ints_and_strings_are_split():
    p = params(stop=[5, "\n\n", 9, "END", 5])
    assert p.stop_token_ids == frozenset({5, 9, *EOS})
    assert p.stop_strings == ("\n\n", "END")
    assert params(stop="END").stop_strings == ("END",)
    assert params(stop="END").stop_token_ids == frozenset(EOS)
    assert params(stop=11).stop_token_ids == frozenset({11, *EOS})
    assert params(stop=(11, "x")).stop_strings == ("x",)


@pytest.mark.parametrize("name, value", [
    ("temperature", 1e39), ("temperature", 1e7), ("credit_boost", 1e39),
])
def test_values_past_the_device_range_are_refused(name, value):
    """Finite in Python, but past what the device's fp32 can hold: 1e39 is infinite in fp32
    (a NumericalError, or an overflow writing credit_boost)."""
    with pytest.raises(OptionError) as e:
        params(**{name: value})
    assert str(e.value).startswith(f"{name}={value!r} "), str(e.value)
    with pytest.raises(OptionError, match="generation_config.json: temperature=1e"):
        params(gen={**SAMPLE_GEN, "temperature": 1e39})


@pytest.mark.parametrize("name, value", [("temperature", float("inf")),
                                         ("eb_threshold", float("inf")),
                                         ("temperature", float("nan"))])
def test_non_finite_values_are_refused(name, value):
    with pytest.raises(OptionError, match=name):
        params(**{name: value})


def test_stop_ids_outside_the_vocabulary_and_strings_without_tokenizer(tiny_sdar, tiny_llada):
    from dlrt import LLM

    llm = LLM(tiny_sdar)
    for bad in (-5, llm.config.vocab_size, 10**30):
        with pytest.raises(OptionError, match=f"stop token id {bad}"):
            llm.check([1, 2, 3], stop=[bad])
    llm.check([1, 2, 3], stop=[llm.config.vocab_size - 1, "end"])
    with pytest.raises(OptionError, match="needs a tokenizer"):
        LLM(tiny_llada).check([1, 2, 3], stop=["end"])


def test_triton_backend_on_cpu_needs_the_interpreter(tiny_sdar, monkeypatch):
    from dlrt import LLM

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(OptionError, match="needs a CUDA device"):
        LLM(tiny_sdar, device="cpu", attention_backend="triton")


@pytest.mark.parametrize("value", [3e-39, 1e-7, 9.9e-7])
def test_a_temperature_below_the_greedy_bar_is_greedy(value):
    """Below 1e-6 (SGLang's bar) the reciprocal of the temperature overflows fp32 long before
    0 (3e-39: infinite): such a request is greedy, from a request or generation_config.json."""
    assert params(temperature=value).sampling.temperature == 0.0
    assert params(gen={**SAMPLE_GEN, "temperature": value}).sampling.temperature == 0.0
    assert params(temperature=1e-6).sampling.temperature == 1e-6
