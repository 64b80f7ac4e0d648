"""The load-time plan of the quantised layers (`dlrt.tuning.quant`) on the CPU: the choice with
injected timings and checks (the fastest passing candidate, never a wrong or raising one, the
reference within the margin), which layers are planned, the cache, and the real check of a
kernel against the reference under the Triton interpreter."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.layers.quant.fp8 import Fp8Linear  # noqa: E402
from dlrt.layers.quant.nvfp4 import Nvfp4Linear  # noqa: E402
from dlrt.tuning import quant as tq  # noqa: E402


def label_of(fn) -> str:
    return tq._label(asdict(fn.keywords["config"]))


def fakes(us: dict[str, float], errors: dict[str, float], raising=(), reference_us=10.0,
          default_us=50.0):
    """time/check functions reading fixed numbers by candidate label."""
    timed = []

    def time(fn):
        if fn is None:
            return reference_us
        timed.append(label_of(fn))
        return us.get(label_of(fn), default_us)

    def check(fn):
        if label_of(fn) in raising:
            raise RuntimeError("out of resources")
        return errors.get(label_of(fn), 1e-3)

    time.timed = timed
    return time, check


def test_the_choice():
    # at a round's few rows W8A8 is not a candidate (slower than weight-only); above
    # W8A8_FROM_ROWS it is, and the GEMV (4 rows at most) is not
    few = tq.candidates("fp8", 512, 1024, rows=4)
    assert any(lb.startswith("fma") for lb in few) and not any("w8a8" in lb for lb in few)
    configs = {**few, **tq.candidates("fp8", 512, 1024, rows=tq.W8A8_FROM_ROWS + 1)}
    labels = list(configs)
    assert any(lb.startswith("fma") for lb in labels) and any("w8a8" in lb for lb in labels)
    wrong, boom, good, w8a8 = labels[0], labels[1], labels[2], \
        next(lb for lb in labels if "w8a8" in lb)
    time, check = fakes({wrong: 1.0, boom: 1.5, good: 4.0, w8a8: 3.0},
                        {wrong: 0.5, w8a8: 0.2}, raising=(boom,))
    rec = tq.choose("fp8", configs, time, check)
    assert set(rec["candidates"]) == set(configs)  # every candidate recorded
    assert rec["chosen"] == good and rec["chosen_us"] == 4.0
    assert rec["candidates"][wrong]["skipped"].startswith("relative error")
    assert rec["candidates"][boom]["skipped"].startswith("RuntimeError")
    assert rec["candidates"][w8a8]["us"] is None  # 0.2 > the W8A8 bound
    assert wrong not in time.timed and boom not in time.timed  # never timed
    # W8A8 within its looser bound passes; the same error fails a weight-only config
    time, check = fakes({w8a8: 3.0, good: 3.5}, {w8a8: 5e-2, good: 5e-2})
    rec = tq.choose("fp8", configs, time, check)
    assert rec["chosen"] == w8a8 and rec["candidates"][good]["skipped"]
    # nothing 3% faster than the reference: the reference stays (policy triton: the fastest)
    time, check = fakes({good: 9.8}, {})
    assert tq.choose("fp8", configs, time, check)["chosen"] == tq.REFERENCE
    assert tq.choose("fp8", configs, time, check, policy="triton")["chosen"] == good
    # every candidate wrong or raising: the reference
    time, check = fakes({}, {lb: 1.0 for lb in labels[1:]}, raising=(labels[0],))
    assert tq.choose("fp8", configs, time, check)["chosen"] == tq.REFERENCE


@pytest.fixture(scope="module")
def quantised(tiny_sdar):
    return {q: LLM(tiny_sdar, max_model_len=64, quantization=q) for q in ("fp8", "nvfp4")}


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_planned_layers_and_the_cache(quantised, fmt, tmp_path):
    model = quantised[fmt].model
    layers = tq.quant_layers(model)
    quant = {n for n, m in model.named_modules()
             if isinstance(getattr(m, "method", None), (Fp8Linear, Nvfp4Linear))}
    if fmt == "fp8":  # row-layout scales (merged parts not on 128-row blocks) are left alone
        rows_layout = {n for n in quant
                       if model.get_submodule(n).weight_scale_inv.shape[0]
                       == model.get_submodule(n).weight.shape[0] > 1}
        assert rows_layout and not rows_layout & set(layers)
        assert set(layers) == quant - rows_layout
    else:
        assert set(layers) == quant
    shapes = {tq._shape_key(f, m) for f, m in layers.values()}
    calls = []

    def time(layer, f, fn, rows):
        calls.append(rows)
        return 10.0 if fn is None else (2.0 if label_of(fn) == target else 20.0)

    def check(layer, f, fn, rows):
        return 1e-3

    key = next(iter(shapes))
    n, k = (int(v) for v in key.split(",")[1:])
    cands = list(tq.candidates(fmt, n, k, rows=4))
    target = next((lb for lb in cands if lb.startswith("fma")), cands[-1])
    cache = tmp_path / "q.json"
    methods, records = tq.tune_quant(model, torch.float32, rows=4, time=time, check=check,
                                     cache_file=cache)
    assert set(records) == shapes and all(k.startswith(fmt + ",") for k in records)
    assert set(methods) == set(layers) and set(calls) == {4}
    assert records[key]["chosen"] == target
    for name, (f, m) in layers.items():
        chosen = records[tq._shape_key(f, m)]["chosen"]
        assert (methods[name].kernel is None) == (chosen == tq.REFERENCE)
        if chosen == target:
            assert label_of(methods[name].kernel) == target
    # a 4-row GEMV keeps a tensor-core kernel for 5..64 rows (the folded phase's 2B rows)
    gemv = {n: m for n, m in methods.items() if m.kernel and label_of(m.kernel).startswith("fma")}
    assert bool(gemv) == target.startswith("fma")
    for m in gemv.values():
        assert m.max_rows == 4 and m.wide is not None and m.wide_rows == 64
    calls.clear()
    again, _ = tq.tune_quant(model, torch.float32, rows=4, time=time, check=check,
                             cache_file=cache)
    assert calls == [] and {n: label_of(m.kernel) for n, m in again.items() if m.kernel} \
        == {n: label_of(m.kernel) for n, m in methods.items() if m.kernel}
    assert tq.tune_quant(model, torch.float32, policy="cublas", time=time) == ({}, {})


def test_the_real_check_under_the_interpreter(quantised):
    layers = tq.quant_layers(quantised["fp8"].model)
    fmt, layer = next(iter(layers.values()))
    n, k = layer.weight.shape
    configs = tq.candidates(fmt, n, k, rows=2)
    dot = next(c for c in configs.values() if c["kind"] == "dot" and not c["w8a8"])
    good = tq.kernel(fmt, dot)
    assert tq.relative_error(layer, fmt, good, 2, torch.float32) < 1e-4

    def wrong(x, w, s):
        return 2 * good(x, w, s)

    assert tq.relative_error(layer, fmt, wrong, 2, torch.float32) > 0.5


def test_a_gemv_plan_keeps_a_kernel_for_more_rows(quantised, tmp_path):
    """A plan that picks a 4-row GEMV serves 5..64 rows (the folded phase) with the default
    tensor-core kernel, and only prefill rows beyond that with the dequantising reference."""
    from dlrt.kernels.fp8_gemm import fp8_gemm

    model = quantised["fp8"].model
    name, (fmt, layer) = next(iter(tq.quant_layers(model).items()))
    gemv = {"block_n": 16, "block_k": 128, "split_k": 1, "stages": 1, "warps": 2,
            "w8a8": False, "kind": "fma"}
    rec = {"reference_us": 10.0, "chosen": "fma", "chosen_us": 1.0,
           "candidates": {"fma": {"config": gemv, "error": 0.0, "us": 1.0, "skipped": None}}}
    cache = tmp_path / "q.json"  # a cached record: the plan reads it instead of timing
    cache.write_text(json.dumps({tq._shape_key(fmt, layer): rec}))
    methods, _ = tq.tune_quant(model, torch.float32, rows=4, cache_file=cache,
                               time=lambda *a: 10.0, check=lambda *a: 0.0)  # other shapes
    m = methods[name]
    assert label_of(m.kernel).startswith("fma")
    assert m.kernel_for(1) is m.kernel and m.kernel_for(4) is m.kernel
    assert m.kernel_for(5) is fp8_gemm and m.kernel_for(64) is fp8_gemm
    assert m.kernel_for(65) is None
