"""Token editing through `LLM`: who may ask for it (family, decoder), the family's decoding
defaults, one program per round kind, finished blocks only in the stream, and a block loop that
reads nothing from the device but `flag` (what makes the three execution modes identical)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import pytest
import torch

import dlrt.llm
from dlrt import LLM
from dlrt.decoding.options import DecoderDefaults
from dlrt.errors import OptionError
from dlrt.models.llada import LLADA
from dlrt.models.sdar import SDAR
from dlrt.runtime.decoders import DECODERS, decoder_for
from dlrt.runtime.runner import ModelRunner

PROMPT = list(range(300, 313))
EDITS = dict(remasking_strategy="threshold", threshold=0.3, editing_threshold=0.0,
             max_post_steps=3, temperature=0)


def _weights_only(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("model.safetensors", "generation_config.json", "config.json"):
        os.symlink(Path(src) / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def llm(tiny_sdar, tmp_path_factory):
    out = LLM(_weights_only(tiny_sdar, tmp_path_factory.mktemp("edit") / "c"), dtype="float32")
    out.model.lm_head.weight.data.mul_(50.0)  # confidences spread over (0, 1)
    return out


@pytest.fixture
def editing_family(monkeypatch):
    """Every family edits (the LLaDA2 record is not here yet; the loop is the same)."""
    real = dlrt.llm.family
    monkeypatch.setattr(dlrt.llm, "family",
                        lambda name: dataclasses.replace(real(name), supports_editing=True))


# --- who may edit ------------------------------------------------------------------------------

def test_a_family_that_does_not_edit_refuses_editing_threshold(llm):
    with pytest.raises(OptionError) as e:
        llm.check(PROMPT, editing_threshold=0.5)
    msg = str(e.value)
    assert msg.startswith("editing_threshold=0.5 ") and "sdar" in msg and "LLaDA2" in msg
    llm.check(PROMPT, max_post_steps=3)  # harmless without editing


def test_editing_needs_the_block_decoder(tiny_llada, editing_family):
    llada = LLM(tiny_llada, dtype="float32", decoder="dllm_var")
    with pytest.raises(OptionError) as e:
        llada.check([5, 6, 7], editing_threshold=0.5)
    assert "'block' decoder" in str(e.value) and "dllm_var" in str(e.value)


def test_family_defaults_apply_to_its_default_decoder_under_the_trained_block():
    own = DecoderDefaults(32, "threshold", threshold=0.95)
    fam = dataclasses.replace(SDAR, decoder_defaults=own, supports_editing=True)
    assert decoder_for(fam, None, None) == ("block", own)
    assert decoder_for(fam, "block", 4) == ("block", dataclasses.replace(own, block_length=4))
    assert decoder_for(SDAR, None, None)[1] == DECODERS["block"][2]  # no family defaults
    other = dataclasses.replace(LLADA, decoder_defaults=own)
    assert decoder_for(other, "dllm_var", None)[1] == DECODERS["dllm_var"][2]  # not default


# --- requests ----------------------------------------------------------------------------------

def test_one_program_per_editing_kind_whatever_the_values(llm, editing_family):
    before = len(llm.decoder.programs)
    for et, post, th in ((0.0, 0, 0.3), (0.5, 3, 0.6), (1.0, 16, 0.9)):
        llm.generate(PROMPT, max_new_tokens=8, **{**EDITS, "editing_threshold": et,
                                                  "max_post_steps": post, "threshold": th})
    assert len(llm.decoder.programs) == before + 1
    llm.generate(PROMPT, max_new_tokens=8, **{**EDITS, "editing_threshold": None})
    assert len(llm.decoder.programs) == before + 2  # editing off: another kind
    kinds = {p.key[-1].editing for p in llm.decoder.programs[-2:]}
    assert kinds == {True, False}


def test_streamed_blocks_are_final(llm, editing_family):
    """Blocks are streamed once decided (edits happen inside the active block only)."""
    streamed = [(list(b.token_ids), list(b.commit_rounds), b.rounds)
                for b in llm.stream(PROMPT, max_new_tokens=24, ignore_eos=True, **EDITS)]
    result = llm.generate(PROMPT, max_new_tokens=24, ignore_eos=True, **EDITS)
    assert [t for s in streamed for t in s[0]] == result.token_ids
    assert [r for s in streamed for r in s[1]] == result.commit_rounds
    assert [s[2] for s in streamed] == result.denoise_steps
    b = llm.decoder_defaults.block_length
    assert all(rounds <= b + 3 for rounds in result.denoise_steps)
    assert any(rounds > 1 for rounds in result.denoise_steps)


_forbidden = {"on": False}
_HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@contextlib.contextmanager
def no_host_reads():
    _forbidden["on"] = True
    try:
        yield
    finally:
        _forbidden["on"] = False


@pytest.fixture
def guarded(monkeypatch, llm):
    """Tensor reads to the host raise inside `no_host_reads()`, except in the model forward
    (the CPU attention backend reads the lengths; CUDA backends do not)."""
    for name in _HOST_READS:
        real = getattr(torch.Tensor, name)

        def read(self, *args, _real=real, _name=name, **kwargs):
            if _forbidden["on"]:
                raise AssertionError(f"host read Tensor.{_name} in a block program")
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, read)
    forward = ModelRunner.forward

    def unguarded(*args, **kwargs):
        was, _forbidden["on"] = _forbidden["on"], False
        try:
            return forward(*args, **kwargs)
        finally:
            _forbidden["on"] = was
    monkeypatch.setattr(ModelRunner, "forward", unguarded)


@pytest.mark.parametrize("editing_threshold", [None, 0.0, 0.5])
def test_the_loop_reads_only_the_flag(llm, editing_family, guarded, monkeypatch,
                                      editing_threshold):
    """Run each block as a graph executor does (begin, round while flag, end; nothing read in
    between but `flag`): the same tokens as the eager executor."""
    opts = dict(EDITS, editing_threshold=editing_threshold, max_new_tokens=20, ignore_eos=True)
    eager = llm.generate(PROMPT[:6], **opts)

    def run(program, phase):
        with no_host_reads():
            program.phases[phase]()
        while program.state.flag.item():
            with no_host_reads():
                program.round()
        with no_host_reads():
            program.end()
    monkeypatch.setattr(llm.executor, "_run", run)
    loop = llm.generate(PROMPT[:6], **opts)
    assert (loop.token_ids, loop.denoise_steps, loop.commit_rounds) == \
        (eager.token_ids, eager.denoise_steps, eager.commit_rounds)
