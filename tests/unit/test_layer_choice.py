"""The load-time choice between the classic dense layer and the fused-GEMV layer
(`dlrt.kernels.gemm_select._tune_layers`), with the timing replaced by fixed numbers: which
layers get `LayerGEMVs`, the cache file, `force`, and settings left by an earlier tune."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.kernels import gemm_select  # noqa: E402


@pytest.fixture
def tiny(tiny_sdar, monkeypatch):
    llm = LLM(tiny_sdar, max_model_len=64)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: SimpleNamespace(multi_processor_count=16))
    calls = []

    def fake_time_layer(w, rows):
        calls.append(rows)
        cfg = {"block_n": 8, "block_k": 64, "split_k": 1, "stages": 2, "warps": 1,
               "kind": "fma"}
        return dict(classic_us=10.0, fused_us=fake_time_layer.fused_us,
                    configs={r: cfg for r in ("qkv", "o", "gate_up", "down")}, role_us={})

    fake_time_layer.fused_us = 5.0
    monkeypatch.setattr(gemm_select, "time_layer", fake_time_layer)
    layers = [m for m in llm.model.modules() if callable(getattr(m, "dense_weights", None))]
    return llm, layers, calls, fake_time_layer


def test_faster_fused_layer_is_set_on_every_dense_layer_and_cached(tiny, tmp_path):
    llm, layers, calls, _ = tiny
    path = tmp_path / "gemm.json"
    stored, records = {}, {}
    gemm_select._tune_layers(llm.model, 4, False, stored, records, path)
    assert len(layers) == 2 and all(m.gemvs is not None for m in layers)
    assert records["layer"]["chosen"] == "fused" and calls == [4]
    key = next(k for k in json.loads(path.read_text()) if k.startswith("layer"))
    # a second load reads the file: no timing
    gemm_select._tune_layers(llm.model, 4, False, json.loads(path.read_text()), {}, path)
    assert calls == [4] and "forced" not in key


def test_slower_fused_layer_stays_classic_unless_forced(tiny, tmp_path):
    llm, layers, calls, fake = tiny
    fake.fused_us = 12.0
    records = {}
    gemm_select._tune_layers(llm.model, 4, False, {}, records, tmp_path / "a.json")
    assert records["layer"]["chosen"] == "classic" and all(m.gemvs is None for m in layers)
    stored = json.loads((tmp_path / "a.json").read_text())
    gemm_select._tune_layers(llm.model, 4, True, stored, records, tmp_path / "a.json")
    assert records["layer"]["chosen"] == "fused" and all(m.gemvs is not None for m in layers)
    assert len(calls) == 2  # forced choices change the classic time: timed under its own key
    # a later tune for rows the GEMV does not serve clears what the last one set
    gemm_select._tune_layers(llm.model, 8, True, {}, {}, tmp_path / "a.json")
    assert all(m.gemvs is None for m in layers)
