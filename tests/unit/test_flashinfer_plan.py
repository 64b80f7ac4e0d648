"""The FlashInfer backend's host side, without FlashInfer (CPU):

- `requests`: a forward mapped onto FlashInfer's paged requests gives, when each request is
  attended to the way FlashInfer does (its pages, non-causal), what the SDPA reference gives
  for the forward (fp32, 1e-5), for block rounds, folded rounds, prefill chunks and canvases,
  over a shuffled page table;
- `Program.spans`: for every decoder, the forwards a block really runs are exactly the ones
  the executor planned before launching it (a recording backend that plans on the host).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlrt import LLM, OptionError
from dlrt.attention.backend import AttentionSpan, ForwardMeta, check_model, default_backend
from dlrt.attention.flashinfer import kernel_for_rows, requests
from dlrt.attention.sdpa import SDPABackend
from dlrt.runtime.kv_cache import PagedKVCache


def _flashinfer_semantics(q, cache, layer, reqs, scale):
    """Each request's queries attend, non-causally, to every key of its pages (the last page
    up to last_page_len): FlashInfer's paged prefill, written out in PyTorch."""
    out = torch.empty_like(q)
    page = cache.page_size
    for r in range(reqs.batch):
        lo, hi = reqs.qo_indptr[r].item(), reqs.qo_indptr[r + 1].item()
        pages = reqs.kv_indices[reqs.kv_indptr[r]:reqs.kv_indptr[r + 1]].long()
        n_keys = (pages.numel() - 1) * page + reqs.last_page_len[r].item()
        k = cache.k[layer][pages].reshape(-1, *cache.k.shape[-2:])[:n_keys]
        v = cache.v[layer][pages].reshape(-1, *cache.v.shape[-2:])[:n_keys]
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
    got = _flashinfer_semantics(q, cache, 1, reqs, 0.3)
    lens = torch.tensor([span.start, span.kv_len], dtype=torch.int32)
    meta = ForwardMeta(span.start + torch.arange(span.n), lens, span.chunk_block)
    want = SDPABackend().forward(1, q, 0.3, meta, cache)
    n_real = min(span.n, span.kv_len - span.start)  # canvas padding rows see all keys
    assert torch.allclose(got[:n_real], want[:n_real], atol=1e-5, rtol=1e-5)
    assert reqs.kv_indptr[-1].item() == reqs.kv_indices.numel()
    assert (reqs.last_page_len >= 1).all() and (reqs.last_page_len <= page).all()


def test_requests_reject_lengths_outside_the_pages():
    table = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="keys"):
        requests(AttentionSpan(4, 4, 64, 68), 16, table)  # 68 keys > 4 pages of 16


def test_fa3_only_for_full_query_tiles():
    assert kernel_for_rows("fa3", 4, 32, 8) == "fa2"      # a block of 4: 16 packed rows
    assert kernel_for_rows("fa3", 256, 32, 32) == "fa3"   # a LLaDA canvas
    assert kernel_for_rows("fa2", 512, 32, 8) == "fa2"


class RecordingBackend(SDPABackend):
    """SDPA attention that plans on the host like FlashInfer: records each forward's span and
    whether the executor had planned it."""

    plans_on_host = True

    def __init__(self):
        self.armed: list[AttentionSpan] = []
        self.planned: list[list[AttentionSpan]] = []
        self.used: set[AttentionSpan] = set()
        self.unplanned: list[AttentionSpan] = []
        self.mismatched: list[AttentionSpan] = []

    def plan_block(self, spans, cache, h_q):
        self.armed = list(spans)
        self.planned.append(list(spans))

    def disarm(self):
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


def _record(path, prompt_len, **kw):
    llm = LLM(path, device="cpu", max_model_len=512, **{k: v for k, v in kw.items()
                                                          if k == "decoder"})
    rec = RecordingBackend()
    llm.runner.backend = rec
    llm.executor.host_planned = True
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


def test_flashinfer_needs_a_gpu_and_a_head_size_it_builds(tiny_sdar):
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match="needs a CUDA GPU"):
            LLM(tiny_sdar, attention_backend="flashinfer")
    with pytest.raises(OptionError, match="head_dim"):
        check_model("flashinfer-fa2", 16)
    check_model("flashinfer", 128)
    check_model("triton", 16)
    with pytest.raises(OptionError, match="unknown attention backend"):
        LLM(tiny_sdar, attention_backend="flashinfer3")


@pytest.mark.parametrize("decoder,capability,installed,head_dim,dtype,want", [
    ("canvas", (9, 0), True, 128, torch.bfloat16, "flashinfer"),
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
    assert default_backend(torch.device("cuda"), dtype, decoder, head_dim) == want
    assert default_backend(torch.device("cpu"), dtype, decoder, head_dim) == "sdpa"
