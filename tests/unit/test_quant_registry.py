"""One quantisation format = one module: a format registers itself
(`dlrt.layers.quant.registry`), and the `quantization` option's choices, the checkpoint reader,
make-checkpoint and the load-time plan find it there. A format defined here (FP8 weights under
another name) is a choice of the option and of the CLI, is read from a folder's config, is
written by make-checkpoint and loads to the tokens of the same weights in FP8. The engine asks
the format which path serves it on a GPU (`path_note`) and hands it the activation setup
(`set_activations` before the weights load, `check_activations` after); nothing of FP8 runs
for another format."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest
import torch

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.quant import QuantScheme, read_scheme
from dlrt.engine import engine as engine_module
from dlrt.engine.config import EngineConfig
from dlrt.engine.engine import Engine
from dlrt.entrypoints.cli import build_parser, engine_kwargs
from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.quant import registry
from dlrt.layers.quant.compressed_tensors import CT_FP8_FORMAT
from dlrt.layers.quant.fp8 import FP8_FORMAT, Fp8Format
from dlrt.layers.quant.nvfp4 import NVFP4_FORMAT, Nvfp4Format

PROMPT = [5, 6, 7, 8, 9]


class Fp8Again(Fp8Format):
    """FP8 weights with a scale row per weight row, declared as "fp8-again"."""

    name = "fp8-again"
    declared = "'fp8-again' (quant_method 'fp8-again')"

    def __init__(self):
        super().__init__(block_rows=False)

    def for_parts(self, parts):
        return self

    def reads(self, q):
        return q.get("quant_method") == "fp8-again"

    def checkpoint_config(self, not_convert):
        config, files = super().checkpoint_config(not_convert)
        return {**config, "quant_method": "fp8-again"}, files


@pytest.fixture
def again(monkeypatch):
    monkeypatch.setattr(registry, "_FORMATS", dict(registry.formats()))
    return registry.register(Fp8Again())


def _choices(name):
    return tuple(next(f for f in dataclasses.fields(EngineConfig)
                      if f.name == name).metadata["choices"])


def test_the_formats_register_themselves():
    assert registry.formats() == {"compressed-tensors-fp8": CT_FP8_FORMAT, "fp8": FP8_FORMAT,
                                  "nvfp4": NVFP4_FORMAT}
    assert _choices("quantization") == ("auto", "none", "compressed-tensors-fp8", "fp8",
                                        "nvfp4")
    class Other(Fp8Format):
        pass

    with pytest.raises(ValueError, match="'fp8' is registered twice"):
        registry.register(Other(block_rows=True))
    assert registry.formats()["fp8"] is FP8_FORMAT
    with pytest.raises(ValueError, match=r"'fp8' is registered twice \(dlrt\.layers\.quant\.fp8"
                       r"\.Fp8Format at 0x[0-9a-f]+, dlrt\.layers\.quant\.fp8\.Fp8Format at"):
        registry.register(Fp8Format(block_rows=False))
    assert registry.formats()["fp8"] is FP8_FORMAT
    assert registry.register(FP8_FORMAT) is FP8_FORMAT
    with pytest.raises(OptionError, match=r"unknown quantised format; one of "
                       r"\['compressed-tensors-fp8', 'fp8', 'nvfp4'\]"):
        registry.get_format("int4")


def test_a_registered_format_is_a_choice_and_is_read(again, tiny_sdar, tmp_path):
    assert _choices("quantization") == ("auto", "none", "compressed-tensors-fp8", "fp8",
                                        "fp8-again", "nvfp4")
    assert EngineConfig.from_kwargs(quantization="fp8-again").quantization == "fp8-again"
    args = build_parser().parse_args(["generate", "--prompt", "x", "--quantization",
                                      "fp8-again"])
    assert engine_kwargs(args)["quantization"] == "fp8-again"
    folder = tmp_path / "declared"
    folder.mkdir()
    for f in tiny_sdar.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    hf = json.loads((folder / "config.json").read_text())
    hf["quantization_config"] = again.checkpoint_config(["lm_head"])[0]
    (folder / "config.json").write_text(json.dumps(hf))
    resolved = Engine.open(EngineConfig.from_kwargs(model=str(folder), device="cpu",
                                                    load_format="dummy"))[0]
    assert resolved.quant.name == resolved.engine.quantization == "fp8-again"
    assert resolved.quant.not_convert == ("lm_head",) and resolved.quant.fmt is again


def test_a_registered_format_is_a_choice_of_make_checkpoint(again):
    from dlrt.checkpoint.make import write_choices

    assert write_choices() == ("none", "compressed-tensors-fp8", "fp8", "fp8-again", "nvfp4")
    args = build_parser().parse_args(["make-checkpoint", "tiny-sdar", "out", "--quantization",
                                      "fp8-again"])
    assert args.quantization == "fp8-again"


def test_a_registered_format_is_written_and_loaded(again, tmp_path):
    ours = make_checkpoint("tiny-sdar", tmp_path / "again", dtype="float32",
                           quantization="fp8-again")
    fp8 = make_checkpoint("tiny-sdar", tmp_path / "fp8", dtype="float32", quantization="fp8")
    assert json.loads((ours / "config.json").read_text())["quantization_config"][
        "quant_method"] == "fp8-again"
    llm = LLM(ours, max_model_len=64)
    formats = {m.quant_format for m in llm.model.modules() if hasattr(m, "quant_format")}
    assert formats == {again} and llm.engine_config.quantization == "fp8-again"
    assert llm.generate(PROMPT, max_new_tokens=8).token_ids == \
        LLM(fp8, max_model_len=64).generate(PROMPT, max_new_tokens=8).token_ids


def test_an_unknown_format_names_every_registered_one(tmp_path):
    hf = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}
    with pytest.raises(CheckpointError) as e:
        read_scheme(hf, tmp_path)
    message = str(e.value)
    assert "quant_method 'modelopt' with quant_algo 'FP8' is not supported" in message
    assert FP8_FORMAT.declared in message and NVFP4_FORMAT.declared in message
    assert CT_FP8_FORMAT.declared in message


@pytest.mark.parametrize("name,capability,level,says", [
    ("fp8", (8, 0), logging.WARNING, "fp8 weights on a GPU of compute capability 8.0, which has "
                                     "no FP8 tensor cores (sm_89+): served by the dequantising"),
    ("fp8", (9, 0), None, None),
    ("nvfp4", (8, 6), logging.WARNING, "nvfp4 weights on compute capability 8.6, which has no "
                                       "e4m3 conversions (sm_89+) for the group scales"),
    ("nvfp4", (9, 0), logging.INFO, "nvfp4 weights on compute capability 9.0, which has no FP4 "
                                    "tensor cores (sm_100+): weight-only kernels"),
    ("nvfp4", (10, 0), None, None),
    ("compressed-tensors-fp8", (8, 6), logging.WARNING, "compressed-tensors-fp8 weights on a GPU "
     "of compute capability 8.6, which has no FP8 tensor cores (sm_89+): served by the "
     "dequantising path"),
    ("compressed-tensors-fp8", (9, 0), logging.INFO, "compressed-tensors-fp8 weights on compute "
     "capability 9.0: projections by the FP8 tensor-core kernels on per-channel scales"),
])
def test_the_format_says_which_path_serves_it_on_a_gpu(monkeypatch, caplog, name, capability,
                                                       level, says):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    with caplog.at_level(logging.INFO, logger="dlrt.engine.engine"):
        engine_module._report_quantization(QuantScheme(name), torch.device("cuda"))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    if says is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0][0] == level and lines[0][1].startswith(says)
    assert not (name == "nvfp4" and any("FP8 tensor cores" in m for _, m in lines))


class Nvfp4Spy(Nvfp4Format):
    """NVFP4 weights under another name, whose activation hooks say when they run."""

    name = "nvfp4-spy"

    def __init__(self):
        self.calls = []

    def reads(self, q):
        return False

    def set_activations(self, model, activations):
        self.calls.append(("set", activations, any(p.is_meta for p in model.parameters())))

    def check_activations(self, model, ops, dtype, device):
        self.calls.append(("check", dtype, any(p.is_meta for p in model.parameters())))


def test_the_engine_runs_the_formats_activation_hooks(monkeypatch, tiny_sdar):
    """set_activations before the weights are materialised, check_activations after they are
    loaded; the FP8 functions are never called for another format."""
    from dlrt.layers.quant import fp8

    def fp8_only(*args):
        raise AssertionError("FP8 activation code ran for an NVFP4 model")

    monkeypatch.setattr(registry, "_FORMATS", dict(registry.formats()))
    spy = registry.register(Nvfp4Spy())
    monkeypatch.setattr(fp8, "set_activations", fp8_only)
    monkeypatch.setattr(fp8, "check_fused_input", fp8_only)
    llm = LLM(tiny_sdar, device="cpu", quantization="nvfp4-spy", max_model_len=64,
              fp8_activations="weight_only")
    assert spy.calls == [("set", "weight_only", True), ("check", torch.float32, False)]
    assert llm.generate(PROMPT, max_new_tokens=4).token_ids
