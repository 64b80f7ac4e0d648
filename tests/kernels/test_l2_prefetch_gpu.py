"""The L2 prefetch on the GPU (marked `gpu`; the bulk prefetch needs compute capability 9.0):
it runs eagerly and captured in a CUDA graph after a kernel that writes what it prefetches,
changes no value, and a model decodes the same greedy tokens with the prefetch chain on and
off in every execution mode."""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.kernels import l2_prefetch

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif(not _hopper(), reason="bulk L2 prefetch needs compute capability 9.0")
@pytest.mark.parametrize("shape,nbytes", [((1000, 136), 2**20),  # capped at its size
                                          ((4096, 520), 3 * 2**20 + 48), ((64, 64), 200)])
def test_prefetch_eager_and_captured(shape, nbytes):
    torch.manual_seed(0)
    w = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    expect = w.clone()
    assert l2_prefetch.supported(w) and l2_prefetch.lines(w, nbytes) > 0
    l2_prefetch.prefetch(w, nbytes)
    torch.cuda.synchronize()
    out = torch.empty_like(w)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.mul_(2.0)  # the producer the prefetch follows
        l2_prefetch.prefetch(w, nbytes)
        out.copy_(w)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect * 8) and torch.equal(w, expect * 8)


@pytest.mark.parametrize("mode", ["eager", "host_loop", "device_loop"])
def test_prefetch_chain_keeps_greedy_tokens(tiny_sdar, mode, monkeypatch):
    monkeypatch.setenv("DLRT_L2_PREFETCH_MB", "1")
    on = LLM(tiny_sdar, device="cuda", dtype="float32", max_model_len=2048)
    assert len(on.prefetch_chain) == on.config.num_layers * 4 + 1
    monkeypatch.setenv("DLRT_L2_PREFETCH_MB", "0")
    off = LLM(tiny_sdar, device="cuda", dtype="float32", max_model_len=2048)
    assert off.prefetch_chain == []
    prompts = [[(13 * i + 5) % 1000 for i in range(n)] for n in (1, 7, 300)]
    opts = dict(max_new_tokens=24, temperature=0, block_length=4, ignore_eos=True)
    runs = []
    for llm in (on, off):
        llm.set_execution_mode(mode)
        runs.append([llm.generate(p, **opts).token_ids for p in prompts])
    assert runs[0] == runs[1] and all(len(t) == 24 for t in runs[0])
