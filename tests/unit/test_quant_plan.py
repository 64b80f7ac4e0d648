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
from dlrt.layers.quant.compressed_tensors import CtFp8Linear  # noqa: E402
from dlrt.layers.quant.fp8 import Fp8Linear  # noqa: E402
from dlrt.layers.quant.nvfp4 import Nvfp4Linear  # noqa: E402
from dlrt.layers.quant.registry import get_format  # noqa: E402
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
    # the activation mode picks the candidates: weight-only "dot" and GEMV configs, or W8A8
    configs = tq.candidates("fp8", 512, 1024, rows=4)
    w8a8 = tq.candidates("fp8", 512, 1024, rows=4, activations="dynamic")
    assert any(lb.startswith("fma") for lb in configs)
    assert not any("w8a8" in lb for lb in configs)
    assert w8a8 and all(lb.startswith("dot-w8a8") for lb in w8a8)
    labels = list(configs)
    wrong, boom, good = labels[0], labels[1], labels[2]
    time, check = fakes({wrong: 1.0, boom: 1.5, good: 4.0}, {wrong: 0.5}, raising=(boom,))
    rec = tq.choose("fp8", configs, time, check)
    assert set(rec["candidates"]) == set(configs)  # every candidate recorded
    assert rec["chosen"] == good and rec["chosen_us"] == 4.0
    assert rec["candidates"][wrong]["skipped"].startswith("relative error")
    assert rec["candidates"][boom]["skipped"].startswith("RuntimeError")
    assert wrong not in time.timed and boom not in time.timed  # never timed
    # just outside the bound fails, just inside passes
    tolerance = get_format("fp8").tolerance
    time, check = fakes({good: 3.5}, {good: 1.01 * tolerance})
    assert tq.choose("fp8", configs, time, check)["candidates"][good]["skipped"]
    time, check = fakes({good: 3.5}, {good: 0.99 * tolerance})
    assert tq.choose("fp8", configs, time, check)["chosen"] == good
    # nothing 3% faster than the reference: the reference stays (policy triton: the fastest)
    time, check = fakes({good: 9.8}, {})
    assert tq.choose("fp8", configs, time, check)["chosen"] == tq.REFERENCE
    assert tq.choose("fp8", configs, time, check, policy="triton")["chosen"] == good
    # every candidate wrong or raising: the reference
    time, check = fakes({}, {lb: 1.0 for lb in labels[1:]}, raising=(labels[0],))
    assert tq.choose("fp8", configs, time, check)["chosen"] == tq.REFERENCE


@pytest.fixture(scope="module")
def quantised(tiny_sdar):
    out = {q: LLM(tiny_sdar, max_model_len=64, quantization=q) for q in ("fp8", "nvfp4")}
    out["fp8-weight_only"] = LLM(tiny_sdar, max_model_len=64, quantization="fp8",
                                 fp8_activations="weight_only")
    out[CT] = LLM(tiny_sdar, max_model_len=64, quantization=CT)
    return out


CT = "compressed-tensors-fp8"


@pytest.mark.parametrize("mode", ["dynamic", "weight_only"])
def test_compressed_tensors_layers_are_planned(quantised, mode, tmp_path):
    """Per-channel scales concatenate for any part sizes, so every compressed-tensors layer
    is planned; its candidates are the tensor-core configs of its activation mode (no GEMV);
    the planned method keeps its class, activation mode and fused input."""
    model = quantised[CT].model
    for m in model.modules():
        if isinstance(getattr(m, "method", None), CtFp8Linear):
            m.method.activations = mode
    quant = {n for n, m in model.named_modules()
             if isinstance(getattr(m, "method", None), CtFp8Linear)}
    layers = tq.quant_layers(model)
    assert quant and set(layers) == quant and {f for f, _ in layers.values()} == {CT}
    fmt, layer = next(iter(layers.values()))
    n, k = layer.weight.shape
    cands = tq.candidates(CT, n, k, rows=4, activations=mode)
    assert cands and all(lb.startswith("dot-w8a8" if mode == "dynamic" else "dot ")
                         for lb in cands)
    target = list(cands)[-1]

    def time(layer, f, fn, rows):
        return 10.0 if fn is None else (2.0 if label_of(fn) == target else 20.0)

    methods, records = tq.tune_quant(model, torch.float32, rows=4, time=time,
                                     check=lambda *a: 1e-3, cache_file=tmp_path / "q.json")
    assert set(methods) == quant and all(key.startswith(CT + ",") for key in records)
    for name, method in methods.items():
        assert type(method) is CtFp8Linear and method.activations == mode
        assert method.fused_input
        if records[tq._shape_key(CT, model.get_submodule(name))]["chosen"] == target:
            assert label_of(method.kernel) == target
    assert any(m.kernel is not None for m in methods.values())
    # the real check under the interpreter: the layer's mode passes, the other mode does not
    dots = {a: next(iter(tq.candidates(CT, n, k, rows=2, activations=a).values()))
            for a in ("dynamic", "weight_only")}
    good = tq.kernel(CT, dots[mode])
    assert tq.relative_error(layer, CT, good, 2, torch.float32) < 1e-4
    other = tq.kernel(CT, dots["weight_only" if mode == "dynamic" else "dynamic"])
    assert tq.relative_error(layer, CT, other, 2, torch.float32) > 1e-3


@pytest.mark.parametrize("fmt", ["fp8", "fp8-weight_only", "nvfp4"])
def test_planned_layers_and_the_cache(quantised, fmt, tmp_path):
    model = quantised[fmt].model
    fmt, mode = fmt.split("-")[0], ("weight_only" if fmt != "fp8" else "dynamic")
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
    n, k = (int(v) for v in key.split(",")[1:3])
    assert key.endswith(",w8a8") == (fmt == "fp8" and mode == "dynamic")
    cands = list(tq.candidates(fmt, n, k, rows=4, activations=mode))
    target = next((lb for lb in cands if lb.startswith("fma")), cands[-1])
    cache = tmp_path / "q.json"
    unfused = next(iter(layers)) if fmt == "fp8" else None  # a failed fused-input check
    if unfused:
        model.get_submodule(unfused).method.fused_input = False
    methods, records = tq.tune_quant(model, torch.float32, rows=4, time=time, check=check,
                                     cache_file=cache)
    if unfused:
        model.get_submodule(unfused).method.fused_input = True
    assert set(records) == shapes and all(k.startswith(fmt + ",") for k in records)
    assert set(methods) == set(layers) and set(calls) == {4}
    assert records[key]["chosen"] == target
    for name, (f, m) in layers.items():
        chosen = records[tq._shape_key(f, m)]["chosen"]
        assert (methods[name].kernel is None) == (chosen == tq.REFERENCE)
        if chosen == target:
            assert label_of(methods[name].kernel) == target
        if fmt == "fp8":  # the plan keeps the layer's activation mode and fused input
            assert methods[name].activations == mode
            assert methods[name].fused_input == (name != unfused)
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


@pytest.mark.parametrize("mode", ["dynamic", "weight_only"])
def test_the_real_check_under_the_interpreter(quantised, mode):
    """A kernel of the layer's activation mode passes its check; the other mode's kernel, or
    a wrong one, does not."""
    layers = tq.quant_layers(quantised["fp8" if mode == "dynamic" else "fp8-weight_only"].model)
    fmt, layer = next(iter(layers.values()))
    n, k = layer.weight.shape
    dots = {a: next(c for c in tq.candidates(fmt, n, k, rows=2, activations=a).values()
                    if c["kind"] == "dot") for a in ("dynamic", "weight_only")}
    assert dots["dynamic"]["w8a8"] and not dots["weight_only"]["w8a8"]
    good = tq.kernel(fmt, dots[mode])
    assert tq.relative_error(layer, fmt, good, 2, torch.float32) < 1e-4
    other = tq.kernel(fmt, dots["weight_only" if mode == "dynamic" else "dynamic"])
    assert tq.relative_error(layer, fmt, other, 2, torch.float32) > 1e-3

    def wrong(x, w, s):
        return 2 * good(x, w, s)

    assert tq.relative_error(layer, fmt, wrong, 2, torch.float32) > 0.5


def test_a_gemv_plan_keeps_a_kernel_for_more_rows(quantised, tmp_path):
    """A plan that picks a 4-row GEMV serves 5..64 rows (the folded phase) with the default
    tensor-core kernel, and only prefill rows beyond that with the dequantising reference."""
    from dlrt.kernels.fp8_gemm import fp8_gemm

    model = quantised["fp8-weight_only"].model  # the GEMV is weight-only
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
