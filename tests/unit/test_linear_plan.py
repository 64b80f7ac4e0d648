"""Linear methods chosen at load (`dlrt.tuning.linear.tune`), with the timing replaced by fixed
numbers: the policies, the timing cache, and two LLMs in one process keeping their own choices
(the methods live on each model's layers, not in a global table)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.kernels import skinny_gemm as sg  # noqa: E402
from dlrt.tuning.linear import linear_layers, tune  # noqa: E402

CONFIG = {"block_n": 8, "block_k": 64, "split_k": 1, "stages": 2, "warps": 1, "kind": "fma"}


def fake_timer(triton_us: float):
    """A timer: cuBLAS 10 us, Triton `triton_us` (no Triton config for the wide LM head)."""
    calls = []

    def timer(w: torch.Tensor, rows: int) -> dict:
        calls.append((tuple(w.shape), rows))
        wide = w.shape[0] > 1024
        return dict(cublas_us=10.0, triton_us=None if wide else triton_us,
                    config=None if wide else CONFIG, norm_us=1.0)

    timer.calls = calls
    return timer


def methods(llm: LLM) -> dict[str, str]:
    return {name: m.method.name for name, m in linear_layers(llm.model).items()}


@pytest.fixture(scope="module")
def pair(tiny_sdar):
    return (LLM(tiny_sdar, max_model_len=64, kernels="triton"),
            LLM(tiny_sdar, max_model_len=64, kernels="triton"))


def test_policies_and_the_timing_cache(pair, tmp_path):
    llm = pair[0]
    cache = tmp_path / "gemm.json"
    faster = fake_timer(5.0)
    plan = tune(llm.model, rows=4, policy="auto", timer=faster, cache_file=cache)
    shapes = {tuple(m.weight.shape) for m in linear_layers(llm.model).values()}
    assert len(faster.calls) == len(shapes)  # one timing per distinct weight shape
    chosen = {n: m.name for n, m in plan.methods.items()}
    assert chosen["lm_head"] == "cublas"  # no Triton config for it
    assert {v for n, v in chosen.items() if n != "lm_head"} == {"triton"}
    assert plan.records["64,64"]["chosen"] == "triton"
    again = fake_timer(5.0)
    tune(llm.model, rows=4, policy="auto", timer=again, cache_file=cache)
    assert again.calls == []  # read from the cache file
    slower = fake_timer(9.9)  # within the 3% margin: cuBLAS stays
    plan = tune(llm.model, rows=4, policy="auto", timer=slower, cache_file=tmp_path / "b.json")
    assert {m.name for m in plan.methods.values()} == {"cublas"}
    forced = tune(llm.model, rows=4, policy="triton", timer=slower,
                  cache_file=tmp_path / "b.json")
    assert {n: m.name for n, m in forced.methods.items()} == chosen
    none = fake_timer(5.0)
    assert {m.name for m in tune(llm.model, policy="cublas", timer=none).methods.values()} \
        == {"cublas"} and none.calls == []
    with pytest.raises(ValueError, match="policy"):
        tune(llm.model, policy="fastest")


def test_two_llms_keep_their_own_choices(pair, tmp_path, monkeypatch):
    a, b = pair
    tokens = torch.tensor([11, 22, 33, 44])
    before = a.runner.forward_at(tokens, 0, 4)
    plan = tune(b.model, rows=4, policy="triton", timer=fake_timer(5.0),
                cache_file=tmp_path / "t.json")
    plan.apply(b.model)
    assert set(methods(a).values()) == {"cublas"}
    assert "triton" in set(methods(b).values())
    calls = []
    real = sg.skinny_gemm
    monkeypatch.setattr(sg, "skinny_gemm", lambda *args: calls.append(1) or real(*args))
    after = a.runner.forward_at(tokens, 0, 4)
    assert calls == [] and torch.equal(before, after)  # a's layers never took b's kernel
    out = b.runner.forward_at(tokens, 0, 4)
    assert len(calls) >= 4  # b's projections did
    torch.testing.assert_close(out, before, rtol=1e-4, atol=1e-4)


def test_a_timing_cache_is_replaced_whole_and_a_broken_one_is_timed_again(tmp_path):
    """Ranks timing the same shapes at once replace the file whole (never half-written);
    a file that does not parse reads as empty, so its shapes are timed again."""
    from dlrt.tuning.linear import read_cache, write_cache

    path = tmp_path / "cache" / "gemm.json"
    path.parent.mkdir()
    path.write_text('{"4096,4096": {"cublas_us": 1.0}}trailing')
    assert read_cache(path) == {}
    write_cache(path, {"4096,4096": {"cublas_us": 2.0}})
    assert read_cache(path) == {"4096,4096": {"cublas_us": 2.0}}
    assert [p.name for p in path.parent.iterdir()] == ["gemm.json"]
