"""The FlashInfer backend's host side, without FlashInfer (CPU):

- `requests`: a forward mapped onto FlashInfer's paged requests gives, when each request is
  attended to the way FlashInfer does (its pages, non-causal), what the SDPA reference gives
  for the forward (fp32, 1e-5), for block rounds, folded rounds, prefill chunks and canvases,
  over a shuffled page table;
- `Program.spans`: for every decoder, the forwards a block really runs are exactly the ones
  the executor planned before launching it (a recording backend that plans on the host).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from dlrt import LLM, OptionError
from dlrt.attention import flashinfer as fi_backend
from dlrt.attention.base import AttentionSpan, ForwardMeta
from dlrt.attention.flashinfer import (
    FlashInferBackend,
    FlashInferFA2Backend,
    Requests,
    kernel_for_span,
    on_triton,
    requests,
)
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.registry import check_backend, default_backend
from dlrt.attention.sdpa import SDPABackend
from dlrt.engine import engine as engine_module


def _flashinfer_semantics(q, k_pages, v_pages, reqs, scale):
    """Each request's queries attend, non-causally, to every key of its pages (the last page
    up to last_page_len): FlashInfer's paged prefill, written out in PyTorch.
    k_pages, v_pages: [num_pages, page_size, Hkv, D] (NHD)."""
    out = torch.empty_like(q)
    page = k_pages.shape[1]
    for r in range(reqs.batch):
        lo, hi = reqs.qo_indptr[r].item(), reqs.qo_indptr[r + 1].item()
        pages = reqs.kv_indices[reqs.kv_indptr[r]:reqs.kv_indptr[r + 1]].long()
        n_keys = (pages.numel() - 1) * page + reqs.last_page_len[r].item()
        k = k_pages[pages].reshape(-1, *k_pages.shape[-2:])[:n_keys]
        v = v_pages[pages].reshape(-1, *v_pages.shape[-2:])[:n_keys]
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1), k.transpose(0, 1),
                                           v.transpose(0, 1), scale=scale)
        out[lo:hi] = o.transpose(0, 1)
    return out


@pytest.mark.parametrize("span", [
    AttentionSpan(4, 4, 0, 4),          # block 0, empty context
    AttentionSpan(4, 4, 37, 41),        # block round over a prefix that ends mid-page
    AttentionSpan(8, 4, 96, 104),       # folded round: [decided block + new block]
    AttentionSpan(24, 4, 16, 40),       # prefill chunk of 6 blocks after a cached chunk
    AttentionSpan(20, 8, 0, 20),        # chunk whose last block is partial
    AttentionSpan(64, None, 0, 45),     # canvas: 64 slots, 45 real tokens (padding rows)
    AttentionSpan(8, None, 30, 46),     # dLLM-Var look-ahead forward
])
def test_requests_reproduce_the_chunk_mask(span):
    torch.manual_seed(span.n + span.kv_len)
    h_q, h_kv, d, page = 6, 2, 16, 16
    cache = PagedKVCache(2, h_kv, d, 160, torch.float32, "cpu", page_size=page)
    cache.k.normal_()
    cache.v.normal_()
    cache.page_table = torch.randperm(cache.num_pages).to(torch.int32)
    q = torch.randn(span.n, h_q, d)
    reqs = requests(span, page, cache.page_table)
    got = _flashinfer_semantics(q, cache.k[1], cache.v[1], reqs, 0.3)
    lens = torch.tensor([span.start, span.kv_len], dtype=torch.int32)
    meta = ForwardMeta(span.start + torch.arange(span.n), lens, span.chunk_block)
    want = SDPABackend(cache, h_q).forward(1, q, 0.3, meta, cache)
    n_real = min(span.n, span.kv_len - span.start)  # canvas padding rows see all keys
    assert torch.allclose(got[:n_real], want[:n_real], atol=1e-5, rtol=1e-5)
    assert reqs.kv_indptr[-1].item() == reqs.kv_indices.numel()
    assert (reqs.last_page_len >= 1).all() and (reqs.last_page_len <= page).all()


def test_requests_reject_lengths_outside_the_pages():
    table = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="keys"):
        requests(AttentionSpan(4, 4, 64, 68), 16, table)  # 68 keys > 4 pages of 16


def test_fa3_only_where_every_request_fills_a_tile():
    assert kernel_for_span("fa3", AttentionSpan(4, 4, 0, 4)) == "fa2"         # a block
    assert kernel_for_span("fa3", AttentionSpan(64, None, 0, 60)) == "fa2"    # small canvas
    assert kernel_for_span("fa3", AttentionSpan(256, None, 0, 240)) == "fa3"  # LLaDA canvas
    assert kernel_for_span("fa3", AttentionSpan(512, 4, 0, 512)) == "fa2"     # 4 per request
    assert kernel_for_span("fa3", AttentionSpan(512, 256, 0, 512)) == "fa3"
    assert kernel_for_span("fa2", AttentionSpan(256, None, 0, 240)) == "fa2"
    assert on_triton(AttentionSpan(512, 4, 0, 512)) and not on_triton(AttentionSpan(8, 4, 4, 12))
    assert not on_triton(AttentionSpan(256, None, 0, 240))


class RecordingBackend(SDPABackend):
    """SDPA attention that plans on the host like FlashInfer: records each forward's span and
    whether the executor had planned it."""

    plans_on_host = True

    def __init__(self, cache, num_q_heads):
        super().__init__(cache, num_q_heads)
        self.armed: list[AttentionSpan] = []
        self.planned: list[list[AttentionSpan]] = []
        self.used: set[AttentionSpan] = set()
        self.unplanned: list[AttentionSpan] = []
        self.mismatched: list[AttentionSpan] = []

    def plan_block(self, spans):
        self.armed = list(spans)
        self.planned.append(list(spans))

    def end_block(self):
        self.armed = []

    def forward(self, layer, q, scale, meta, cache):
        if layer == 0:
            span = AttentionSpan(q.shape[0], meta.chunk_block, *meta.lens.tolist())
            if not self.armed:
                self.unplanned.append(span)
            elif span in self.armed:
                self.used.add(span)
            else:
                self.mismatched.append(span)
        return super().forward(layer, q, scale, meta, cache)


def built_with(backend, path, **kw):
    """An LLM whose forwards run on `backend(cache, num_q_heads)`, built into its runner and
    executor (the executor calls its host hooks)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module, "get_backend", lambda name, cache, heads: backend(cache, heads))
        return LLM(path, **kw)


def _record(path, prompt_len, **kw):
    llm = built_with(RecordingBackend, path, device="cpu", max_model_len=512,
                     **{k: v for k, v in kw.items() if k == "decoder"})
    rec = llm.runner.backend
    assert isinstance(rec, RecordingBackend) and llm.executor.backend is rec
    options = {k: v for k, v in kw.items() if k != "decoder"}
    llm.generate(list(range(100, 100 + prompt_len)), temperature=0, **options)
    return rec


@pytest.mark.parametrize("prompt_len", [3, 8, 21])
def test_block_decoder_plans_every_forward(tiny_sdar, prompt_len):
    rec = _record(tiny_sdar, prompt_len, max_new_tokens=12, block_length=4)
    assert not rec.mismatched
    planned = {s for block in rec.planned for s in block}
    assert planned == rec.used  # every planned forward ran, with the planned lengths
    assert any(s.n == 8 for s in rec.used)  # folded rounds were among them
    assert all(s.n == 4 * (prompt_len // 4) for s in rec.unplanned)  # only the prefill


def test_canvas_decoder_plans_every_forward(tiny_llada):
    rec = _record(tiny_llada, 21, max_new_tokens=28, block_length=8)
    assert not rec.mismatched and not rec.unplanned
    assert {s for block in rec.planned for s in block} == rec.used
    assert rec.used == {AttentionSpan(64, None, 0, 49)}


def test_dllm_var_decoder_plans_every_forward(tiny_llada):
    rec = _record(tiny_llada, 13, max_new_tokens=24, block_length=8, decoder="dllm_var")
    assert not rec.mismatched
    assert {s for block in rec.planned for s in block} == rec.used
    assert AttentionSpan(16, None, 13, 29) in rec.used  # look-ahead of block 1
    assert rec.unplanned == [AttentionSpan(21, None, 0, 21)]  # prompt + first block


def test_flashinfer_needs_a_gpu_and_a_head_size_it_builds(tiny_sdar, monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match="needs a CUDA GPU"):
            LLM(tiny_sdar, attention_backend="flashinfer")
    monkeypatch.setattr(fi_backend, "kernel_for", lambda device, kernels, name: "fa2")
    cuda = torch.device("cuda")
    why = FlashInferFA2Backend.supports(cuda, torch.bfloat16, "eager", 16)
    assert "'flashinfer-fa2' has kernels for head_dim" in why
    assert FlashInferBackend.supports(cuda, torch.bfloat16, "device_loop", 128) is None
    check_backend("triton", torch.device("cuda"), torch.bfloat16, "eager", 16)
    with pytest.raises(OptionError, match="unknown attention backend"):
        LLM(tiny_sdar, attention_backend="flashinfer3")


@pytest.mark.parametrize("decoder,capability,installed,head_dim,dtype,want", [
    ("canvas", (9, 0), True, 128, torch.bfloat16, "flashinfer"),
    ("canvas", (9, 0), "broken", 128, torch.bfloat16, "triton"),  # found, but fails to import
    ("block", (9, 0), True, 128, torch.bfloat16, "triton"),      # blocks of a few queries
    ("dllm_var", (9, 0), True, 128, torch.bfloat16, "triton"),
    ("canvas", (8, 0), True, 128, torch.bfloat16, "triton"),     # not measured off Hopper
    ("canvas", (9, 0), False, 128, torch.bfloat16, "triton"),    # FlashInfer not installed
    ("canvas", (9, 0), True, 16, torch.bfloat16, "triton"),      # no kernels for head_dim 16
    ("canvas", (9, 0), True, 128, torch.float32, "triton"),
])
def test_default_backend(monkeypatch, decoder, capability, installed, head_dim, dtype, want):
    import importlib.util

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        (object() if installed else None) if name == "flashinfer" else real(name, *a)))
    # sys.modules[name] = None makes the import raise ImportError
    monkeypatch.setitem(sys.modules, "flashinfer",
                        types.ModuleType("flashinfer") if installed is True else None)
    assert default_backend(torch.device("cuda"), dtype, decoder, head_dim) == want
    assert default_backend(torch.device("cpu"), dtype, decoder, head_dim) == "sdpa"


class FakePrefillWrapper:
    """FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` in PyTorch for the CPU: `plan`
    stores the request layout in the wrapper's buffers (in CUDA-graph mode the buffers given at
    construction, as FlashInfer does) and `run` reads it back from them, so a plan that is not
    renewed for new lengths gives wrong attention."""

    def __init__(self, workspace, layout, use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, backend="auto"):
        assert layout == "NHD" and backend in ("fa2", "fa3")
        self.graph = use_cuda_graph
        self.bufs = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf,
                     paged_kv_last_page_len_buf)

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, h_q, h_kv, d, page,
             causal, sm_scale, q_data_type, kv_data_type):
        assert not causal
        layout = (qo_indptr, kv_indptr, kv_indices, last_page_len)
        if self.graph:
            for buf, t in zip(self.bufs, layout, strict=True):
                buf[:t.numel()].copy_(t)
        else:
            self.bufs = tuple(t.clone() for t in layout)
        self.sm_scale = sm_scale

    def run(self, q, kv, q_scale):
        return _flashinfer_semantics(q, kv[0], kv[1], Requests(*self.bufs),
                                     self.sm_scale * q_scale)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """FlashInferBackend on the CPU: the PyTorch stand-in above for FlashInfer's wrapper."""
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = FakePrefillWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(fi_backend, "kernel_for", lambda device, kernels, name: "fa2")


def _tokens(llm, prompts, **options):
    return [llm.generate(p, temperature=0, **options).token_ids for p in prompts]


@pytest.mark.parametrize("preset,decoder,prompt_lens,options", [
    ("sdar", None, [3, 8, 21, 45, 13], dict(max_new_tokens=12, block_length=4)),
    ("llada", None, [21, 5], dict(max_new_tokens=28, block_length=8)),
    ("llada", "dllm_var", [13, 40, 7], dict(max_new_tokens=24, block_length=8)),
])
def test_flashinfer_backend_decodes_like_sdpa(fake_flashinfer, tiny_sdar, tiny_llada, preset,
                                              decoder, prompt_lens, options):
    """One LLM, several requests of different lengths: every block re-plans its forwards,
    prefills of over two blocks run on the Triton kernel; tokens equal the SDPA reference's."""
    path = tiny_sdar if preset == "sdar" else tiny_llada
    kw = dict(device="cpu", max_model_len=1024, decoder=decoder)
    ref, fi = LLM(path, **kw), built_with(fi_backend.FlashInferBackend, path, **kw)
    for llm in (ref, fi):  # sharper distributions: greedy choices are far from ties
        head = llm.model.lm_head.weight if hasattr(llm.model, "lm_head") else \
            llm.model.model.transformer.ff_out.weight
        head.data *= 50
    prompts = [[(7 * i + 3 * n) % 120000 for i in range(n)] for n in prompt_lens]
    assert _tokens(fi, prompts, **options) == _tokens(ref, prompts, **options)


def test_flashinfer_checks(monkeypatch, tiny_sdar):
    monkeypatch.setattr(fi_backend, "kernel_for", lambda device, kernels, name: "fa2")
    with pytest.raises(OptionError, match="bfloat16 or float16"):
        check_backend("flashinfer", torch.device("cuda"), torch.float32, "eager")
    monkeypatch.setenv("DLRT_ATTENTION_BACKEND", "warp")
    with pytest.raises(OptionError, match="DLRT_ATTENTION_BACKEND=warp"):
        LLM(tiny_sdar, device="cpu")
    monkeypatch.delenv("DLRT_ATTENTION_BACKEND")
    with pytest.raises(OptionError, match="head_dim"):  # tiny-sdar has head_dim 16
        LLM(tiny_sdar, device="cpu", dtype="bfloat16", attention_backend="flashinfer")
