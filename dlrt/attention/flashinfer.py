"""FlashInfer attention backend: `BatchPrefillWithPagedKVCacheWrapper` over the paged cache.

Kernels ("flashinfer"): on Hopper (sm_90) FA3 for forwards whose packed query rows (tokens x
query heads per KV head) fill at least one 128-row tile (prefill chunks, a LLaDA canvas), and
FA2 for a block of a few queries: FA2 splits the context over CTAs (split-KV), FA3's persistent
kernel gives each (query tile, KV head) one CTA over the whole context. Elsewhere (sm_80+), and
always with "flashinfer-fa2": FA2.

FlashInfer divides the work on the host (`plan`) from the lengths, and its kernels then read
that plan from device buffers. So this backend is *host-planned*: before a block is launched,
the executor reads the block's lengths and `plan_block` plans every forward the block will run
(`Program.spans`) into buffers that the captured graphs point at (FlashInfer's CUDA-graph
mode). One graph still serves every context length; the price is one host plan per block, and
blocks are not launched ahead of the previous block's read-back (a plan's host-to-device copy
must not be overwritten by the next plan before it ran). Forwards outside a planned block
(prefill, the first dLLM-Var block) are planned when they run (one host sync).

A forward of N queries maps onto FlashInfer requests that all read the same pages
(`requests`): full attention (chunk_block None) is one request of N queries over kv_len keys;
block-causal attention is one request per block of the chunk, the r-th seeing keys
< min(kv_len, start + (r + 1) * chunk_block). Every request is non-causal, so the kernels need
no custom mask (FA3 has none).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from dlrt.attention.backend import AttentionSpan, ForwardMeta
from dlrt.errors import OptionError
from dlrt.runtime.kv_cache import PagedKVCache

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 << 20  # FlashInfer's split-KV scratch (its recommended size)
FA3_MIN_ROWS = 128           # packed query rows of one FA3 tile


@dataclass(frozen=True)
class Requests:
    """FlashInfer's paged layout of one forward (int32, on the host): qo_indptr [R+1],
    kv_indptr [R+1] (pages), kv_indices [kv_indptr[-1]] (page ids), last_page_len [R]."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor

    @property
    def batch(self) -> int:
        return self.qo_indptr.numel() - 1


def requests(span: AttentionSpan, page_size: int, page_table: torch.Tensor) -> Requests:
    """The FlashInfer requests of one forward (see the module docstring).

    Args:
        span: the forward's query count, chunk block and (start, kv_len).
        page_size: tokens per page; page_table: [num_pages] int32 host page ids.
    Raises:
        ValueError: kv_len beyond the pages, or a request with no key to attend to.
    """
    n, cb = span.n, span.chunk_block
    if cb is None:
        qo = [0, n]
        kv = [span.kv_len]
    else:
        r = -(-n // cb)
        qo = [min(i * cb, n) for i in range(r + 1)]
        kv = [min(span.kv_len, span.start + (i + 1) * cb) for i in range(r)]
    if min(kv) < 1 or max(kv) > page_table.numel() * page_size:
        raise ValueError(f"{span}: every request needs 1..{page_table.numel() * page_size} keys")
    pages = [-(-k // page_size) for k in kv]
    kv_indptr = [0]
    for p in pages:
        kv_indptr.append(kv_indptr[-1] + p)
    indices = torch.cat([page_table[:p] for p in pages])
    last = [k - (p - 1) * page_size for k, p in zip(kv, pages, strict=True)]
    i32 = dict(dtype=torch.int32)
    return Requests(torch.tensor(qo, **i32), torch.tensor(kv_indptr, **i32),
                    indices.to(torch.int32), torch.tensor(last, **i32))


def kernel_for(device: torch.device, kernels: str) -> str:
    """FlashInfer's kernel family for `device`: "fa3" on sm_90 when `kernels` is "auto",
    "fa2" on sm_80+.

    Raises:
        OptionError: not a CUDA device, FlashInfer missing, or a GPU older than sm_80 (each
            message says what to use instead).
    """
    if device.type != "cuda":
        raise OptionError("attention backend 'flashinfer' needs a CUDA GPU; use 'sdpa' on "
                          f"{device.type}")
    try:
        import flashinfer  # noqa: F401
    except ImportError as e:
        raise OptionError("attention backend 'flashinfer' needs FlashInfer: pip install "
                          "flashinfer-python (or use attention_backend='triton')") from e
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise OptionError(f"FlashInfer's attention kernels need sm_80 or newer; this GPU is "
                          f"sm_{major}{minor}: use attention_backend='triton'")
    return "fa3" if kernels == "auto" and major == 9 else "fa2"


def kernel_for_rows(family: str, n: int, h_q: int, h_kv: int) -> str:
    """FA3 (when the family allows it) for at least 128 packed query rows, else FA2."""
    return "fa3" if family == "fa3" and n * (h_q // h_kv) >= FA3_MIN_ROWS else "fa2"


class FlashInferBackend:
    """Host-planned FlashInfer attention (see the module docstring). `kernels`: "auto" (FA3
    on Hopper, else FA2) or "fa2"."""

    plans_on_host = True
    kernels = "auto"

    def __init__(self):
        self._workspace: torch.Tensor | None = None
        self._graph: dict[tuple, tuple] = {}   # (n, chunk_block) -> (wrapper, planned span)
        self._armed: dict[tuple, AttentionSpan] = {}
        self._eager: dict[str, tuple] = {}     # kernels -> (wrapper, span): unplanned forwards
        self._eager_key: str | None = None
        self._host_table: torch.Tensor | None = None
        self._heads = None

    # -- planning --------------------------------------------------------------------------
    def _setup(self, cache: PagedKVCache, h_q: int) -> None:
        if self._workspace is None:
            dev = cache.k.device
            self._kind = kernel_for(dev, self.kernels)
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
            self._host_table = cache.page_table.cpu()
            log.info("FlashInfer attention: %s kernels", self._kind)
        self._heads = (h_q, cache.k.shape[-2], cache.k.shape[-1], cache.page_size,
                       cache.k.dtype)

    def _wrapper(self, reqs: Requests | None, cache: PagedKVCache, kind: str):
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper

        if reqs is None:
            return BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=kind)
        dev, i32 = cache.k.device, torch.int32
        r = reqs.batch
        return BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=torch.empty(r + 1, dtype=i32, device=dev),
            paged_kv_indptr_buf=torch.empty(r + 1, dtype=i32, device=dev),
            paged_kv_indices_buf=torch.empty(r * cache.num_pages, dtype=i32, device=dev),
            paged_kv_last_page_len_buf=torch.empty(r, dtype=i32, device=dev),
            backend=kind)

    def _plan(self, wrapper, span: AttentionSpan) -> Requests:
        h_q, h_kv, d, page, dtype = self._heads
        reqs = requests(span, page, self._host_table)
        wrapper.plan(reqs.qo_indptr, reqs.kv_indptr, reqs.kv_indices, reqs.last_page_len,
                     h_q, h_kv, d, page, causal=False, sm_scale=1.0, q_data_type=dtype,
                     kv_data_type=dtype)
        return reqs

    def plan_block(self, spans: list[AttentionSpan], cache: PagedKVCache, h_q: int) -> None:
        """Plan every forward of the block about to be launched (host; before capture too).

        Raises:
            ValueError: two forwards of one shape with different lengths in one block.
        """
        self._setup(cache, h_q)
        self._armed = {}
        for span in spans:
            key = (span.n, span.chunk_block)
            if key in self._armed and self._armed[key] != span:
                raise ValueError(f"one block plans {key} twice: {self._armed[key]} and {span}")
            self._armed[key] = span
            if key not in self._graph:
                reqs = requests(span, cache.page_size, self._host_table)
                kind = kernel_for_rows(self._kind, span.n, h_q, cache.k.shape[-2])
                self._graph[key] = (self._wrapper(reqs, cache, kind), None)
            wrapper, planned = self._graph[key]
            if planned != span:
                self._plan(wrapper, span)
                self._graph[key] = (wrapper, span)

    def disarm(self) -> None:
        """The planned block is launched: later forwards (a prefill) plan for themselves."""
        self._armed = {}

    # -- forward ---------------------------------------------------------------------------
    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache) -> torch.Tensor:
        n, h_q, _ = q.shape
        key = (n, meta.chunk_block)
        if torch.cuda.is_current_stream_capturing():
            if key not in self._armed:
                raise RuntimeError(f"FlashInfer forward {key} captured without a plan; the "
                                   "executor plans a block's forwards before capturing it")
            wrapper = self._graph[key][0]
        elif key in self._armed:
            wrapper = self._graph[key][0]
            if layer == 0:
                self._check_armed(key, meta)
        else:
            if layer == 0 or self._eager_key is None:
                self._plan_eager(n, h_q, meta, cache)
            wrapper = self._eager[self._eager_key][0]
        return wrapper.run(q.contiguous(), (cache.k[layer], cache.v[layer]), q_scale=scale)

    def _plan_eager(self, n: int, h_q: int, meta: ForwardMeta, cache: PagedKVCache) -> None:
        """Plan a forward outside a planned block (reads its lengths: one host sync)."""
        start, kv_len = meta.lens.tolist()
        span = AttentionSpan(n, meta.chunk_block, start, kv_len)
        self._setup(cache, h_q)
        kind = kernel_for_rows(self._kind, n, h_q, cache.k.shape[-2])
        wrapper, planned = self._eager.get(kind, (None, None))
        if wrapper is None:
            wrapper = self._wrapper(None, cache, kind)
        if planned != span:
            self._plan(wrapper, span)
        self._eager[kind] = (wrapper, span)
        self._eager_key = kind

    def _check_armed(self, key: tuple, meta: ForwardMeta) -> None:
        span = self._armed[key]
        if meta.lens.tolist() != [span.start, span.kv_len]:
            raise RuntimeError(f"FlashInfer forward {key} runs at lens {meta.lens.tolist()} "
                               f"but the block planned {span}")


class FlashInferFA2Backend(FlashInferBackend):
    """The FA2 kernels on every GPU (Hopper included)."""

    kernels = "fa2"
