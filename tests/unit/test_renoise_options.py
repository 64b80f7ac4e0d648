"""The options of renoising (DiffusionGemma) decoding: names and defaults of transformers'
`DiffusionGemmaGenerationConfig`, defaults from a `generation_config.json` (as transformers
writes it), validation errors that name the option (the server's 400), and the options without
effect in either kind of family."""

from __future__ import annotations

import json
import math

import pytest

from dlrt.decoding.ignored import ignored_options
from dlrt.decoding.options import (
    DecoderDefaults,
    DecodingOptions,
    check_ranges,
    option_name,
    resolve,
)
from dlrt.decoding.renoise_options import NAMES, RenoiseParams
from dlrt.errors import OptionError

RENOISE = DecoderDefaults(block_length=256, remasking_strategy="sequential", renoise=True)
MASK = DecoderDefaults(block_length=4, remasking_strategy="low_confidence_dynamic")


@pytest.fixture
def ref():
    """transformers' DiffusionGemma generation module: the tests that compare with it skip
    without it, the others run."""
    return pytest.importorskip("transformers.models.diffusion_gemma.generation_diffusion_gemma")


def params(gen=None, defaults=RENOISE, **kwargs):
    return resolve(DecodingOptions.from_kwargs(kwargs), defaults, gen or {}, (1, 106), 128, 5)


def reference_values(config) -> dict:
    """The six values of a reference generation config, by our names."""
    values = {k: getattr(config, k) for k in NAMES if k != "entropy_bound"}
    return {**values, "entropy_bound": config.sampler_config.entropy_bound}


def test_defaults_are_the_references(ref):
    ours = params().renoise
    theirs = ref.DiffusionGemmaGenerationConfig._get_default_generation_params()
    config = ref.DiffusionGemmaGenerationConfig(**{k: v for k, v in theirs.items()
                                                   if k != "max_new_tokens"})
    assert ours == RenoiseParams(**reference_values(config))
    assert ours == RenoiseParams(48, 0.1, 0.4, 0.8, 1, 0.005)


def test_defaults_come_from_generation_config_json_as_the_reference_writes_it(ref):
    config = ref.DiffusionGemmaGenerationConfig(
        max_denoising_steps=32, sampler_config=ref.EntropyBoundSamplerConfig(entropy_bound=0.25),
        t_min=0.2, t_max=0.9, stability_threshold=3, confidence_threshold=0.01,
        eos_token_id=[1, 106])
    gen = json.loads(config.to_json_string())
    assert gen["sampler_config"]["entropy_bound"] == 0.25  # where the file keeps it
    got = params(gen).renoise
    assert got == RenoiseParams(**reference_values(config))
    # the request wins over the file, each value on its own
    got = params(gen, t_min=0.1, entropy_bound=2, max_denoising_steps=5).renoise
    assert got == RenoiseParams(5, 2.0, 0.1, 0.9, 3, 0.01)
    assert isinstance(got.entropy_bound, float) and isinstance(got.max_denoising_steps, int)


def test_defaults_from_the_file_save_pretrained_writes(ref, tmp_path):
    """generation_config.json as transformers' `save_pretrained` writes it (sampler_config as
    an object with its class name; null for each value a config leaves unset), read as the
    engine reads a checkpoint folder: the file's values, and the reference's for the nulls."""
    from dlrt.checkpoint.folder import CheckpointFolder

    (tmp_path / "config.json").write_text("{}")

    def saved(config) -> dict:
        config.save_pretrained(tmp_path)
        return CheckpointFolder.open(tmp_path, require_weights=False).generation_config

    config = ref.DiffusionGemmaGenerationConfig(
        max_denoising_steps=32, sampler_config=ref.EntropyBoundSamplerConfig(entropy_bound=0.25),
        t_min=0.2, t_max=0.9, stability_threshold=3, confidence_threshold=0.01)
    gen = saved(config)
    assert gen["sampler_config"]["entropy_bound"] == 0.25
    assert params(gen).renoise == RenoiseParams(32, 0.25, 0.2, 0.9, 3, 0.01)
    gen = saved(ref.DiffusionGemmaGenerationConfig(t_max=0.6))
    assert gen["sampler_config"] is None and gen["t_min"] is None and gen["t_max"] == 0.6
    assert params(gen).renoise == RenoiseParams(t_max=0.6)
    gen = saved(ref.DiffusionGemmaGenerationConfig(
        sampler_config=ref.EntropyBoundSamplerConfig(entropy_bound=1e-3)))
    assert params(gen, t_min=0.0).renoise == RenoiseParams(entropy_bound=1e-3, t_min=0.0)


def test_the_server_answers_a_bad_value_with_a_400_naming_the_field():
    """A request's bad value is a 400 whose `param` is the field as sent (`server.prepare`
    over `LLM.check`, here a renoising family's resolve); a bad checkpoint default is a 400
    that says it comes from generation_config.json."""
    pytest.importorskip("fastapi")
    from dlrt.server import protocol
    from dlrt.server.errors import HTTPError
    from dlrt.server.prepare import prepare
    from dlrt.server.state import ServerState

    class Renoising:  # what `LLM.check` does with the options of a renoising family
        def __init__(self, gen):
            self.gen = gen

        def check(self, prompt, *, chat=False, **options):
            return [1, 2], params(self.gen, **options)

    def state(gen):
        return ServerState(llm=Renoising(gen), worker=None, model_name="m", defaults={},
                           max_body_bytes=1 << 20, metrics=None, created=0)

    def answer(gen, call, body):
        with pytest.raises(HTTPError) as e:
            prepare(state(gen), call, body, "generate")
        assert e.value.status == 400
        return e.value.param, e.value.message

    chat = [{"role": "user", "content": "hi"}]
    for name, value in (("t_min", -1.0), ("entropy_bound", 0), ("max_denoising_steps", 2000),
                        ("stability_threshold", -1), ("confidence_threshold", math.nan),
                        ("t_max", 0.3)):
        for call, body in ((protocol.generate_call,
                            protocol.GenerateRequest(prompt="hi", **{name: value})),
                           (protocol.chat_call,
                            protocol.ChatRequest(messages=chat, **{name: value}))):
            param, message = answer({}, call, body)
            assert param == name and message.startswith(f"{name}="), message
    param, message = answer({"sampler_config": {"entropy_bound": -1.0}}, protocol.generate_call,
                            protocol.GenerateRequest(prompt="hi"))
    assert param is None and message.startswith("generation_config.json: entropy_bound=")
    job = prepare(state({}), protocol.generate_call,
                  protocol.GenerateRequest(prompt="hi", t_min=0.1), "generate")
    assert job.options == {"t_min": 0.1}


def test_mask_families_resolve_no_renoise_values_but_check_their_ranges():
    assert params(defaults=MASK).renoise is None
    assert params(gen={"t_min": -1}, defaults=MASK).renoise is None  # not their file's keys
    with pytest.raises(OptionError, match="^t_min="):
        params(defaults=MASK, t_min=-1.0)
    check_ranges(DecodingOptions.from_kwargs({"t_min": 0.9}))  # t_max may come from the model
    with pytest.raises(OptionError, match="^entropy_bound="):
        check_ranges(DecodingOptions.from_kwargs({"entropy_bound": 0}))


# (name, bad value, whether transformers' DiffusionGemmaGenerationConfig refuses it too;
# its checks of stability_threshold and confidence_threshold raise AttributeError while
# formatting their message)
BAD = [
    ("max_denoising_steps", 0, True),
    ("max_denoising_steps", -3, True),
    ("max_denoising_steps", 1025, False),  # dlrt: each round a forward, cancelled between canvases
    ("entropy_bound", 0.0, True),
    ("entropy_bound", -0.5, True),
    ("entropy_bound", math.nan, False),  # the reference accepts NaN (nan <= 0 is False)
    ("t_min", -0.1, True),
    ("t_min", math.nan, False),
    ("t_max", 2e6, False),  # dlrt: the temperature bound of every family
    ("t_max", math.inf, False),
    ("stability_threshold", -1, True),
    ("stability_threshold", 2**63, False),  # dlrt: int64 on the device
    ("confidence_threshold", 0.0, True),
    ("confidence_threshold", -1.0, True),
    ("confidence_threshold", math.nan, False),
]


def reference_config(ref, name, value):
    if name == "entropy_bound":
        return ref.DiffusionGemmaGenerationConfig(
            sampler_config=ref.EntropyBoundSamplerConfig(value))
    return ref.DiffusionGemmaGenerationConfig(**{name: value})


@pytest.mark.parametrize("name, value, theirs", BAD)
def test_bad_values_name_the_option(name, value, theirs):
    with pytest.raises(OptionError) as e:
        params(**{name: value})
    assert str(e.value).startswith(f"{name}="), e.value
    assert option_name(e.value) == name  # what the server answers with a 400


@pytest.mark.parametrize("name, value, theirs", [
    b for b in BAD if b[2] or b[0] in ("entropy_bound", "confidence_threshold")])
def test_bad_values_the_reference_refuses_too(ref, name, value, theirs):
    if theirs:
        with pytest.raises((ValueError, AttributeError)):
            reference_config(ref, name, value)
    else:
        reference_config(ref, name, value)  # NaN passes the reference's checks


@pytest.mark.parametrize("name, value", [
    ("max_denoising_steps", 4.0), ("max_denoising_steps", "48"), ("max_denoising_steps", True),
    ("stability_threshold", 1.5), ("entropy_bound", "0.1"), ("t_min", True),
    ("t_max", [0.8]), ("confidence_threshold", "x"),
])
def test_bad_types_name_the_option(name, value):
    with pytest.raises(OptionError, match=name):
        DecodingOptions.from_kwargs({name: value})


def test_the_schedule_must_fall():
    """t_max > t_min, as the reference requires; the error names the option the request set."""
    for kwargs in (dict(t_max=0.4), dict(t_min=0.5, t_max=0.5), dict(t_max=0.1, t_min=0.3)):
        with pytest.raises(OptionError, match="^t_max="):
            params(**kwargs)
    with pytest.raises(OptionError, match=r"^t_min=0.9 must be < t_max=0.8"):
        params(t_min=0.9)
    assert params(t_min=0.9, t_max=1.0).renoise.t_min == 0.9
    assert params(gen={"t_max": 1.5}, t_min=0.9).renoise.t_max == 1.5


def test_the_last_rounds_temperature_is_at_least_1e_6():
    """dlrt's addition: t_min + (t_max - t_min) / max_denoising_steps >= 1e-6."""
    with pytest.raises(OptionError, match=r"^t_max=1e-05 .*last round's temperature"):
        params(t_min=0.0, t_max=1e-5, max_denoising_steps=100)
    with pytest.raises(OptionError, match=r"^max_denoising_steps=1000 makes the last"):
        params({"t_min": 0.0, "t_max": 5e-4}, max_denoising_steps=1000)
    with pytest.raises(OptionError, match=r"^generation_config.json: t_max=0.0005 makes the"):
        params({"t_min": 0.0, "t_max": 5e-4, "max_denoising_steps": 1000})
    assert params(t_min=0.0, t_max=2e-4, max_denoising_steps=100).renoise.t_max == 2e-4
    assert params(t_min=1e-6, t_max=2e-6).renoise.t_min == 1e-6


def test_the_reference_refuses_a_rising_schedule_but_not_a_tiny_last_temperature(ref):
    for kwargs in (dict(t_max=0.4), dict(t_min=0.5, t_max=0.5), dict(t_max=0.1, t_min=0.3)):
        with pytest.raises(ValueError):
            ref.DiffusionGemmaGenerationConfig(**{"t_min": 0.4, **kwargs})
    ref.DiffusionGemmaGenerationConfig(t_min=0.0, t_max=1e-5, max_denoising_steps=100)


@pytest.mark.parametrize("gen, name", [
    ({"t_min": "0.4"}, "t_min"),
    ({"max_denoising_steps": 4.5}, "max_denoising_steps"),
    ({"stability_threshold": True}, "stability_threshold"),
    ({"sampler_config": {"entropy_bound": -1}}, "entropy_bound"),
    ({"sampler_config": 0.1}, "sampler_config"),
    ({"confidence_threshold": 0}, "confidence_threshold"),
    ({"t_min": 0.9, "t_max": 0.5}, "t_max"),
    ({"t_min": 0.9}, "t_max"),  # the file's t_min above the reference's t_max
])
def test_bad_checkpoint_defaults_say_where_they_come_from(gen, name):
    with pytest.raises(OptionError, match=rf"^generation_config.json: {name}="):
        params(gen)
    if name != "sampler_config":  # a request that sets the value does not read the file's
        fix = {"entropy_bound": 0.1, "t_max": 1.0}.get(name, {"t_min": 0.3}.get(name, 2))
        params(gen, **{name: fix})


def test_ints_and_inf_as_the_reference_allows():
    """Numbers may be ints (JSON's 1 for 1.0; the reference wants Python floats for
    entropy_bound and confidence_threshold); an infinite bound accepts everything, an infinite
    confidence threshold leaves the stop to the stability."""
    got = params(entropy_bound=1, confidence_threshold=math.inf, t_min=0, t_max=2).renoise
    assert got.entropy_bound == 1.0 and isinstance(got.entropy_bound, float)
    assert got.confidence_threshold == math.inf and got.t_min == 0.0
    assert params(stability_threshold=0, max_denoising_steps=1024).renoise.stability_threshold == 0


def ignored(defaults=RENOISE, **kwargs) -> list[str]:
    opts = DecodingOptions.from_kwargs(kwargs)
    return list(ignored_options(opts, resolve(opts, defaults, {}, (0,), 16, 7)))


def test_options_without_effect():
    mask_only = dict(block_length=8, denoising_steps=4, remasking_strategy="threshold",
                     threshold=0.5, eb_threshold=0.5, low_threshold=0.2, credit_weight=1.0,
                     credit_boost=0.5, credit_decay=0.5, max_post_steps=3, temperature=0.7,
                     top_k=5, top_p=0.9)
    assert ignored(**mask_only) == list(mask_only)
    renoise_only = dict(max_denoising_steps=8, entropy_bound=0.3, t_min=0.1, t_max=0.5,
                        stability_threshold=2, confidence_threshold=0.01)
    assert ignored(**renoise_only) == []
    assert ignored(MASK, **renoise_only) == list(renoise_only)
    always = dict(max_new_tokens=8, seed=3, stop=["x"], ignore_eos=True, top_k=0, top_p=1.0)
    assert ignored(**always) == [] and ignored(MASK, **always) == []
    opts = DecodingOptions.from_kwargs({"temperature": 0.7, "t_min": 0.1})
    text = ignored_options(opts, resolve(opts, RENOISE, {}, (0,), 16, 7))["temperature"]
    assert "t_max to t_min" in text
