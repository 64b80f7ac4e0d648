"""`EngineConfig.resolve`: one step, before anything is built, makes every "auto" and every
default a request needs concrete (`ResolvedConfig`), and every consumer reads it: the block
length a request gets by default is the one the linear plan times, the persistent round is
built for and the benchmarks use."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from dlrt import LLM
from dlrt.bench import accuracy
from dlrt.bench.step import block_and_limit
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.decoding.options import DecodingOptions
from dlrt.engine import config as config_module
from dlrt.engine import engine as engine_module
from dlrt.engine.config import EngineConfig, ResolvedConfig
from dlrt.engine.engine import Engine
from dlrt.runtime.runner import ModelRunner


def _config_only(src, dst):
    """The JSON files of a checkpoint (and its tokenizer), no weights."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    return dst


def _no_modules(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError("resolving built a module")

    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)


@pytest.mark.parametrize("preset,decoder", [("sdar", None), ("llada", None),
                                            ("llada", "dllm_var"), ("llada2", None)])
def test_resolve_builds_nothing(tiny_sdar, tiny_llada, tiny_llada2, tmp_path, monkeypatch,
                                preset, decoder):
    src = {"sdar": tiny_sdar, "llada": tiny_llada, "llada2": tiny_llada2}[preset]
    path = _config_only(src, tmp_path / "json-only")
    options = EngineConfig.from_kwargs(model=str(path), load_format="dummy", device="cpu",
                                       decoder=decoder)
    _no_modules(monkeypatch)
    resolved, folder, _ = Engine.open(options)
    direct = options.resolve(CheckpointFolder.open(path, require_weights=False),
                             resolved.model.mask_token_id)
    monkeypatch.undo()
    assert direct == resolved and isinstance(resolved, ResolvedConfig)
    values = dataclasses.asdict(resolved.engine)
    assert "auto" not in values.values() and None not in values.values(), values
    assert resolved.engine.quantization == "none" and resolved.quant is None
    assert resolved.engine.decoder == (decoder or {"llada": "canvas"}.get(preset, "block"))
    assert isinstance(resolved.block_length, int) and resolved.block_length >= 1
    assert resolved.eos_token_ids and resolved.model.mask_token_id not in resolved.eos_token_ids
    assert resolved.model.mask_token_id == resolved.engine.mask_token_id
    # a request's values come from the resolved config (the engine keeps no copy)
    llm = LLM(path, load_format="dummy", device="cpu", decoder=decoder)
    assert llm.engine.resolved == resolved
    assert (llm.engine_config, llm.config, llm.decoder_defaults, llm.eos_token_ids) == (
        resolved.engine, resolved.model, resolved.decoder_defaults, resolved.eos_token_ids)
    params = llm.resolve(DecodingOptions())
    assert params.block_length == resolved.block_length
    assert set(resolved.eos_token_ids) <= params.stop_token_ids


@pytest.mark.parametrize("preset,decoder,block", [("sdar", None, 4), ("llada", None, 128),
                                                  ("llada", "dllm_var", 64),
                                                  ("llada2", None, 32)])
def test_one_default_block_length(tiny_sdar, tiny_llada, tiny_llada2, monkeypatch, preset,
                                  decoder, block):
    """A default request's block length (the config's trained block, the family's or the
    decoder's default, the canvas decoder's whole default generation) is what the linear plan
    times at (its rows, at most 16), and what the benchmarks use."""
    path = {"sdar": tiny_sdar, "llada": tiny_llada, "llada2": tiny_llada2}[preset]
    planned, real_tune = [], engine_module.tune

    def tune(model, rows=4, policy="auto"):
        planned.append(rows)
        return real_tune(model, policy="cublas")

    monkeypatch.setattr(engine_module, "tune", tune)
    # the timed plan, as on CUDA with the Triton ops (nothing is timed: no quantised layer)
    monkeypatch.setattr(config_module, "linear_kernels", lambda policy, kernels, device: "auto")
    llm = LLM(path, device="cpu", decoder=decoder, max_model_len=512)
    resolved = llm.engine.resolved
    assert llm.resolve(DecodingOptions()).block_length == resolved.block_length == block
    assert planned == [min(block, 16)]
    assert block_and_limit(dict(model=str(path), device="cpu", decoder=decoder), {}) == \
        (block, llm.config.max_position_embeddings)
    assert block_and_limit(dict(model=str(path), device="cpu", decoder=decoder),
                           dict(block_length=8))[0] == 8
    chunks = []
    forward_at = ModelRunner.forward_at
    monkeypatch.setattr(ModelRunner, "forward_at", lambda self, ids, start, chunk_block:
                        chunks.append(chunk_block) or forward_at(self, ids, start, chunk_block))
    accuracy.logits(llm, torch.arange(5))
    assert chunks == [block]
