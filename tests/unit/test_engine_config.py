"""`EngineConfig`: names, types and choices checked before anything is read; every "auto"
resolved for a checkpoint; the CLI's engine flags generated from the fields (each default and
choice written once)."""

from __future__ import annotations

import dataclasses

import pytest

from dlrt import LLM
from dlrt.engine.config import EngineConfig
from dlrt.entrypoints.cli import build_parser, engine_kwargs
from dlrt.errors import OptionError


@pytest.mark.parametrize("kw,message", [
    ({"bogus": 1}, "unknown engine option(s) ['bogus']"),
    ({"max_model_len": "8"}, "max_model_len must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"seed": -1}, "seed=-1 must be in [0, 2^63)"),
    ({"seed": 2**63}, "must be in [0, 2^63)"),
    ({"kernels": 3}, "kernels must be a string"),
    ({"kernels": "cuda"}, "kernels 'cuda': unknown kernels"),
    ({"linear_kernels": "fast"}, "linear_kernels 'fast': unknown linear kernels"),
    ({"quantization": "int4"}, "quantization 'int4': unknown quantization"),
    ({"execution_mode": "loop"}, "unknown execution mode"),
    ({"round_kernel": "mega"}, "round_kernel 'mega': unknown round kernel"),
    ({"dtype": True}, "dtype must be a string"),
])
def test_bad_options_fail_before_anything_is_read(kw, message):
    with pytest.raises(OptionError) as e:
        EngineConfig.from_kwargs(**kw)
    assert message in str(e.value)


def test_none_is_the_default():
    assert EngineConfig.from_kwargs(dtype=None, decoder=None) == EngineConfig()


def test_resolved_config_has_no_auto(tiny_sdar):
    llm = LLM(tiny_sdar, max_model_len=64)
    values = dataclasses.asdict(llm.engine_config)
    assert "auto" not in values.values(), values
    assert values["model"] == str(tiny_sdar) and values["load_format"] == "safetensors"
    assert values["linear_kernels"] == "cublas"  # the CPU: nothing is timed
    assert values["round_kernel"] == "layers"
    assert values["mask_token_id"] == llm.config.mask_token_id == 151669


def test_llm_docstring_names_every_engine_option():
    names = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]
    missing = [n for n in names if n not in LLM.__doc__]
    assert not missing, missing


def test_engine_config_says_the_execution_mode_in_use(tiny_sdar, monkeypatch):
    """After `set_execution_mode`, `engine_config` says the mode switched to (the check is
    faked: the CPU runs only eager)."""
    llm = LLM(tiny_sdar, dtype="float32")
    assert llm.engine_config.execution_mode == llm.execution_mode == "eager"
    monkeypatch.setattr(LLM, "_check_mode", lambda self, mode: None)
    llm.set_execution_mode("host_loop")
    assert llm.engine_config.execution_mode == llm.execution_mode == "host_loop"
    assert dataclasses.replace(llm.engine_config, execution_mode="eager") == llm.engine.config


def test_cli_flags_come_from_the_fields():
    gen = next(a for a in build_parser()._actions if a.dest == "command").choices["generate"]
    actions = {a.dest: a for a in gen._actions}
    for f in dataclasses.fields(EngineConfig):
        dest = (f.metadata["flag"] or "--" + f.name)[2:].replace("-", "_")
        action = actions[dest]
        assert action.default == f.default and action.help.startswith(f.metadata["help"])
        assert tuple(action.choices or ()) == tuple(f.metadata["choices"] or ())
    args = gen.parse_args(["--prompt", "x", "--load-seed", "3", "--kernels", "reference"])
    kw = engine_kwargs(args)
    assert kw["seed"] == 3 and kw["kernels"] == "reference" and set(kw) == \
        {f.name for f in dataclasses.fields(EngineConfig)}
    assert args.seed is None  # --seed is the decoding option; the load seed is --load-seed


def test_persistent_round_needs_cuda():
    with pytest.raises(OptionError, match="round_kernel 'persistent' needs a CUDA device"):
        EngineConfig.from_kwargs(device="cpu", round_kernel="persistent").resolve_device()
