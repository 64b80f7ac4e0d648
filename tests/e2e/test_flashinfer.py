"""The FlashInfer attention backend on the GPU (marked `gpu`; skipped without FlashInfer).

- Kernels: each forward shape (block rounds over short and long contexts, folded rounds,
  prefill chunks, a LLaDA canvas that takes the FA3 kernels on Hopper) against the SDPA
  reference in fp32 on the same bf16 values; relative error < 1e-2 (bf16 output).
- Decoding: device_loop, host_loop and eager commit identical tokens through it (SDAR block
  decoding on and off a block boundary and over thousands of context tokens, seeded sampling,
  LLaDA canvas, dLLM-Var); one set of captured graphs serves every context length, and after
  requests of other lengths its greedy tokens equal a fresh LLM's (a stale plan would not).
  Tokens are not compared with the Triton backend's: in bf16 the two kernels' rounding
  differences can flip a near tie (one did at a 12th token); the CPU tests compare the
  planning with the SDPA reference in fp32 through a PyTorch stand-in for FlashInfer.
Models: the tiny presets with head_dim 128 (FlashInfer builds 64/128/256).
"""

from __future__ import annotations

import pytest
import torch
from test_execution_modes import _assert_same, _llm, _run_modes, head128

from dlrt.attention.base import AttentionSpan, ForwardMeta
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.registry import get_backend
from dlrt.attention.sdpa import SDPABackend

pytestmark = pytest.mark.gpu
pytest.importorskip("flashinfer")

BACKENDS = ("flashinfer", "flashinfer-fa2")


@pytest.fixture(scope="module")
def sdar128(tmp_path_factory):
    return head128(tmp_path_factory, "tiny-sdar", head_dim=128)


@pytest.fixture(scope="module")
def llada128(tmp_path_factory):
    return head128(tmp_path_factory, "tiny-llada", d_model=512, n_heads=4, n_kv_heads=4)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("span,h_q,h_kv", [
    (AttentionSpan(4, 4, 0, 4), 16, 8),
    (AttentionSpan(4, 4, 37, 41), 16, 8),
    (AttentionSpan(4, 4, 16380, 16384), 32, 8),
    (AttentionSpan(8, 4, 3000, 3008), 16, 8),
    (AttentionSpan(512, 4, 1024, 1536), 32, 8),
    (AttentionSpan(256, None, 0, 240), 32, 32),
])
def test_forward_matches_sdpa(name, span, h_q, h_kv):
    torch.manual_seed(span.kv_len)
    d = 128
    cache = PagedKVCache(2, h_kv, d, 16384 + 64, torch.bfloat16, "cuda")
    cache.k.normal_()
    cache.v.normal_()
    q = torch.randn(span.n, h_q, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([span.start, span.kv_len], dtype=torch.int32, device="cuda")
    meta = ForwardMeta(span.start + torch.arange(span.n, device="cuda"), lens, span.chunk_block)
    got = get_backend(name, cache, h_q).forward(1, q, d ** -0.5, meta, cache)
    ref_cache = PagedKVCache(2, h_kv, d, 16384 + 64, torch.float32, "cuda")
    ref_cache.k.copy_(cache.k)
    ref_cache.v.copy_(cache.v)
    want = SDPABackend(ref_cache, h_q).forward(1, q.float(), d ** -0.5, meta, ref_cache)
    n = min(span.n, span.kv_len - span.start)  # canvas padding rows are never read
    err = ((got[:n].float() - want[:n]).norm() / want[:n].norm()).item()
    assert got.dtype == torch.bfloat16 and err < 1e-2, err


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "threshold"])
@pytest.mark.parametrize("prompt_len", [6, 8, 3001])
def test_sdar_modes_identical(sdar128, name, strategy, prompt_len):
    llm = _llm(sdar128, attention_backend=name, max_model_len=4096)
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = _run_modes(llm, prompt, max_new_tokens=24, temperature=0,
                     remasking_strategy=strategy, threshold=0.3)
    _assert_same(out)
    assert len(out["eager"][0]) == 24


def test_seeded_sampling_and_replanning(sdar128):
    llm = _llm(sdar128, attention_backend="flashinfer", max_model_len=4096)
    opts = dict(max_new_tokens=16, temperature=0.8, top_k=50, top_p=0.9, seed=7,
                remasking_strategy="low_confidence_dynamic", threshold=0.3)
    _assert_same(_run_modes(llm, list(range(500, 517)), **opts))
    llm.set_execution_mode("device_loop")
    greedy = dict(max_new_tokens=16, temperature=0, remasking_strategy="low_confidence_static")
    captured = None
    for n in (37, 700, 2500):  # each block re-planned: the tokens follow the new lengths
        llm.generate(list(range(n)), **opts)
        prompt = [(3 * i + n) % 150000 for i in range(n)]
        fresh = _llm(sdar128, attention_backend="flashinfer", max_model_len=4096)
        assert llm.generate(prompt, **greedy).token_ids == \
            fresh.generate(prompt, **greedy).token_ids  # same plans, same kernels: same bits
        # both round specs captured at the first length; later lengths reuse the graphs
        captured = captured or len(llm.executor._graphs)
    assert len(llm.executor._graphs) == captured


@pytest.mark.parametrize("block_length", [None, 8])
def test_llada_canvas_modes_identical(llada128, block_length):
    llm = _llm(llada128, attention_backend="flashinfer")
    _assert_same(_run_modes(llm, list(range(300, 421)), max_new_tokens=140, temperature=0,
                            block_length=block_length, remasking_strategy="low_confidence_dynamic",
                            threshold=0.3))


def test_dllm_var_modes_identical(llada128):
    llm = _llm(llada128, attention_backend="flashinfer", decoder="dllm_var")
    prompt = [(5 * i + 1) % 126000 for i in range(1000)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=32, block_length=8, temperature=0,
                            remasking_strategy="threshold", threshold=0.3))
