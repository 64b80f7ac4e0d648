"""FlashInfer attention backend: `BatchPrefillWithPagedKVCacheWrapper` over the paged cache.

Kernels ("flashinfer"): on Hopper (sm_90) FA3 where each request has at least 128 queries (a
LLaDA canvas), FA2 for blocks of a few queries: FA2 splits the context over CTAs (split-KV),
while FA3's persistent kernel gives each (query tile, query head) one CTA over the whole
context. Elsewhere (sm_80+), and always with "flashinfer-fa2": FA2. Block-causal prefill chunks
of more than two blocks run on dlrt's Triton kernel (`dlrt.kernels.paged_attention`), which
reads the cached prefix once per chunk; as FlashInfer requests (one per block) each block
would read it again.

FlashInfer divides the work on the host (`plan`) from the lengths, and its kernels then read
that plan from device buffers. So this backend is *host-planned*: before a block is launched,
the executor reads the block's lengths and `plan_block` plans every forward the block will run
(`Program.spans`) into buffers that the captured graphs point at (FlashInfer's CUDA-graph
mode). One graph still serves every context length; the price is one host plan per block, and
since the lengths are read after the previous block ended (they advance on the device), a
block is not queued ahead of the previous block's read-back. Forwards outside a planned block
(the first dLLM-Var block, short prefills) are planned when they run (one host sync).

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

from dlrt.attention.base import AttentionBackend, AttentionSpan, ForwardMeta
from dlrt.attention.kv_cache import KV_FP8, PagedKVCache
from dlrt.attention.triton import TritonBackend
from dlrt.errors import OptionError

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 << 20  # FlashInfer's split-KV scratch (its recommended size)
FA3_MIN_ROWS = 128           # query rows of one FA3 tile
HEAD_DIMS = (64, 128, 256)   # head sizes FlashInfer builds kernels for
DTYPES = (torch.bfloat16, torch.float16)


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


def kernel_for(device: torch.device, kernels: str, name: str = "flashinfer") -> str:
    """FlashInfer's kernel family for `device`: "fa3" on sm_90 when `kernels` is "auto",
    "fa2" on sm_80+.

    Raises:
        OptionError: not a CUDA device, FlashInfer missing, or a GPU older than sm_80 (each
            message says what to use instead).
    """
    if device.type != "cuda":
        raise OptionError(f"attention backend {name!r} needs a CUDA GPU; use 'sdpa' on "
                          f"{device.type}")
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # not installed, or built for another torch / CUDA
        raise OptionError(f"attention backend {name!r} needs FlashInfer, whose import failed "
                          f"({type(e).__name__}: {e}): pip install flashinfer-python, or use "
                          "attention_backend='triton'") from e
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise OptionError(f"attention backend {name!r}: FlashInfer's kernels need sm_80 or "
                          f"newer; this GPU is sm_{major}{minor}: use attention_backend='triton'")
    return "fa3" if kernels == "auto" and major == 9 else "fa2"


def kernel_for_span(family: str, span: AttentionSpan) -> str:
    """FA3 (when the family allows it) where every request has at least 128 queries (FA3
    tiles queries per head, so GQA groups do not fill its tiles), else FA2."""
    per_request = min(span.n, span.chunk_block or span.n)
    return "fa3" if family == "fa3" and per_request >= FA3_MIN_ROWS else "fa2"


def on_triton(span: AttentionSpan) -> bool:
    """Block-causal chunks of more than two blocks (prefill) go to the Triton kernel."""
    return span.chunk_block is not None and span.n > 2 * span.chunk_block


class FlashInferBackend(AttentionBackend):
    """Host-planned FlashInfer attention (see the module docstring). `kernels`: "auto" (FA3
    on Hopper, else FA2) or "fa2". Serves CUDA GPUs of sm_80+ with FlashInfer installed,
    bfloat16 / float16 models of head size 64, 128 or 256 and a KV cache of the model dtype;
    capturable. No sliding window and one head shape for every layer (`serves` nothing
    more)."""

    plans_on_host = True
    capturable = True
    kernels = "auto"
    name = "flashinfer"

    @classmethod
    def supports(cls, device, dtype, execution_mode, head_dim=None, kv_cache_dtype=None,
                 needs=()):
        name = cls.name
        if kv_cache_dtype == KV_FP8:
            return (f"attention backend {name!r} does not read an FP8 KV cache "
                    "(kv_cache_dtype='fp8': per-layer scales read from device memory); use "
                    "attention_backend='triton'")
        try:
            kernel_for(device, "auto", name)
        except OptionError as e:
            return str(e)
        if dtype not in DTYPES:
            return (f"attention backend {name!r} needs bfloat16 or float16, not {dtype}; use "
                    f"'triton' for {dtype}")
        if head_dim is not None and head_dim not in HEAD_DIMS:
            return (f"attention backend {name!r} has kernels for head_dim {HEAD_DIMS}, not "
                    f"{head_dim}; use 'triton'")
        return super().supports(device, dtype, execution_mode, head_dim, kv_cache_dtype, needs)

    def __init__(self, cache: PagedKVCache, num_q_heads: int):
        super().__init__(cache, num_q_heads)
        self._workspace: torch.Tensor | None = None
        self._graph: dict[tuple, tuple] = {}   # (n, chunk_block) -> (wrapper, planned span)
        self._armed: dict[tuple, AttentionSpan] = {}
        self._eager: dict[str, tuple] = {}     # kernels -> (wrapper, span): unplanned forwards
        self._eager_key: str | None = None
        self._triton = TritonBackend(cache, num_q_heads)  # prefill chunks (`on_triton`)
        self._host_table: torch.Tensor | None = None
        self._heads = None

    def release(self) -> None:
        """Drop the workspace and every planned wrapper (made again on the next plan)."""
        self._triton.release()
        self._workspace = self._host_table = self._heads = self._eager_key = None
        self._graph, self._armed, self._eager = {}, {}, {}

    # -- planning --------------------------------------------------------------------------
    def _setup(self, cache: PagedKVCache, h_q: int) -> None:
        if self._workspace is None:
            dev = cache.k.device
            self._kind = kernel_for(dev, self.kernels, self.name)
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

    def _requests(self, span: AttentionSpan) -> Requests:
        return requests(span, self._heads[3], self._host_table)

    def _plan(self, wrapper, reqs: Requests) -> None:
        h_q, h_kv, d, page, dtype = self._heads
        wrapper.plan(reqs.qo_indptr, reqs.kv_indptr, reqs.kv_indices, reqs.last_page_len,
                     h_q, h_kv, d, page, causal=False, sm_scale=1.0, q_data_type=dtype,
                     kv_data_type=dtype)

    def plan_block(self, spans: list[AttentionSpan]) -> None:
        """Plan every forward of the block about to be launched (host; before capture too).

        Raises:
            ValueError: two forwards of one shape with different lengths in one block.
        """
        cache = self.cache
        self._setup(cache, self.num_q_heads)
        self._armed = {}
        for span in spans:
            key = (span.n, span.chunk_block)
            if key in self._armed and self._armed[key] != span:
                raise ValueError(f"one block plans {key} twice: {self._armed[key]} and {span}")
            self._armed[key] = span
            wrapper, planned = self._graph.get(key, (None, None))
            if planned != span:
                reqs = self._requests(span)
                if wrapper is None:  # buffers sized by this shape's request count
                    wrapper = self._wrapper(reqs, cache, kernel_for_span(self._kind, span))
                self._plan(wrapper, reqs)
                self._graph[key] = (wrapper, span)

    def end_block(self) -> None:
        """The planned block is launched: later forwards (a prefill) plan for themselves."""
        self._armed = {}

    # -- forward ---------------------------------------------------------------------------
    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache) -> torch.Tensor:
        n, h_q, _ = q.shape
        key = (n, meta.chunk_block)
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
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
            if self._eager_key == "triton":
                return self._triton.forward(layer, q, scale, meta, cache)
            wrapper = self._eager[self._eager_key][0]
        return wrapper.run(q.contiguous(), (cache.k[layer], cache.v[layer]), q_scale=scale)

    def _plan_eager(self, n: int, h_q: int, meta: ForwardMeta, cache: PagedKVCache) -> None:
        """Plan a forward outside a planned block (reads its lengths: one host sync)."""
        start, kv_len = meta.lens.tolist()
        span = AttentionSpan(n, meta.chunk_block, start, kv_len)
        if on_triton(span):
            self._eager_key = "triton"
            return
        self._setup(cache, h_q)
        kind = kernel_for_span(self._kind, span)
        wrapper, planned = self._eager.get(kind, (None, None))
        if wrapper is None:
            wrapper = self._wrapper(None, cache, kind)
        if planned != span:
            self._plan(wrapper, self._requests(span))
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
    name = "flashinfer-fa2"
