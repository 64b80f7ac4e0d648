"""The attention backend interface and the per-forward context that layers receive.

A forward processes a chunk of N tokens at positions start..start+N-1. The attention layer
first writes every chunk token's K/V into the paged cache at its position (positions past the
committed length are scratch: the decoder decides what is committed); then each query attends
to cache keys 0..kv_len-1: the whole prefix before `start`, and inside the chunk either every
key (full, `chunk_block=None`) or its own block and earlier ones (block-causal, blocks of
`chunk_block` tokens counted from the chunk start). `start` and `kv_len` live in a device
tensor (`lens`), so a captured CUDA graph serves every context length.

A layer may have a sliding window W (`window`): a query at position p then sees no key at
position p - W or earlier, where p is the query's own position in a causal or block-causal chunk
(the W keys up to itself; transformers' sliding-window causal mask), and the chunk's `start` in
a full chunk: a bidirectional canvas sees the W - 1 keys before it and all of itself (the
canvas of DiffusionGemma's decoder, whose sliding cache layers keep the last W - 1 positions).

Layers may also differ in head size and KV head count (`PagedKVCache`'s per-layer shapes).

A forward may write nothing to the cache (DiffusionGemma's decoder, like the reference's, reads
the cache and leaves it as it is): the layer then hands the chunk's K/V to the backend
(`chunk_kv`) instead of writing them, and keys start..kv_len-1 come from them (kv_len = start +
N) while the cache serves the prefix below `start`.

What a model needs beyond one head shape, no window and every forward writing its chunk is
named by the constants below; a backend lists those it serves in `serves` and `supports`
refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.attention.kv_cache import PagedKVCache

SLIDING_WINDOW = "sliding_window"  # layers whose queries see only the last W keys
LAYER_SHAPES = "layer_shapes"  # layers of different head size or KV head count
CHUNK_KV = "chunk_kv"  # forwards that write nothing: the chunk's K/V come beside the cache


@dataclass(frozen=True)
class ForwardMeta:
    """Layout of one forward.

    positions: [N] int64 absolute positions of the chunk (start + arange(N)).
    lens: [2] int32 on the model's device: (start, kv_len).
    chunk_block: block-causal block length inside the chunk, or None for full attention.
    """

    positions: torch.Tensor
    lens: torch.Tensor
    chunk_block: int | None


@dataclass(frozen=True)
class AttentionSpan:
    """Host-side lengths of one forward: n queries, chunk_block (None = full attention), and
    the (start, kv_len) its `lens` will hold. Host-planned backends plan from these."""

    n: int
    chunk_block: int | None
    start: int
    kv_len: int


class AttentionBackend:
    """Computes attention for one layer of one forward.

    Backends are built with the cache they read and the number of query heads. The hooks
    around a block let a backend whose kernels read a plan made on the host from the lengths
    (FlashInfer) prepare it; the executor calls them, nothing else does:

    - `plan_block(spans)`: before a block's graphs are captured, replayed or launched, with
      the forwards that block will run (`Program.spans`);
    - `end_block()`: the block is launched; later forwards (a prefill) are not part of it.

    `plans_on_host` says whether the backend needs them: the executor then reads a block's
    lengths on the host (one sync) and does not launch a block before the previous one ended.

    `name` is the `attention_backend` option's value; `capturable`: whether the backend reads
    the lengths from device memory, so it runs inside CUDA graphs; `serves`: the needs
    (SLIDING_WINDOW, LAYER_SHAPES, CHUNK_KV) it serves. `supports` says what a backend serves; the
    registry (`dlrt.attention.registry`) asks it.
    """

    name = "base"
    capturable = False
    plans_on_host = False
    serves: frozenset[str] = frozenset()

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, execution_mode: str,
                 head_dim: int | None = None, kv_cache_dtype: torch.dtype | None = None,
                 needs: tuple[str, ...] = ()) -> str | None:
        """None when the backend serves this device, model dtype, execution mode and (when
        given) head size, KV cache dtype (None: the model dtype) and the model's `needs`
        (`ModelConfig.attention_needs`); else the reason it cannot, a sentence naming the
        backend and what to use instead. Subclasses add their needs and end with these
        checks: every need served, and a graph execution mode needs a capturable backend."""
        missing = [n for n in needs if n not in cls.serves]
        if missing:
            return (f"attention backend {cls.name!r} does not serve {' or '.join(missing)} "
                    "(the model's attention needs it) yet; use 'sdpa'")
        if execution_mode != "eager" and not cls.capturable:
            return (f"execution_mode {execution_mode!r} needs a graph-capturable attention "
                    f"backend (triton, flashinfer), not {cls.name!r}")
        return None

    def __init__(self, cache: PagedKVCache, num_q_heads: int):
        self.cache = cache
        self.num_q_heads = num_q_heads

    def forward(self, layer: int, q: torch.Tensor, scale: float, meta: ForwardMeta,
                cache: PagedKVCache, window: int | None = None,
                chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """q: [N, Hq, D] (RoPE applied) -> [N, Hq, D] in q.dtype.

        The chunk's K/V are already in `cache` at `meta.positions` (the attention layer
        writes them), or, in a forward that writes nothing, `chunk_kv`: (k, v) [N, Hkv, D] in
        q's dtype, with kv_len = start + N (only a backend that serves CHUNK_KV gets them).
        Hq is a multiple of the layer's Hkv. `window`: the layer's sliding window (see the
        module docstring; only a backend that serves SLIDING_WINDOW gets one).
        """
        raise NotImplementedError

    def plan_block(self, spans: list[AttentionSpan]) -> None:
        """Host hook before a block runs (see the class docstring). Default: nothing."""

    def end_block(self) -> None:
        """Host hook once a block is launched. Default: nothing."""

    def release(self) -> None:
        """Free what the backend keeps on the device besides the cache (workspaces, planned
        wrappers' buffers), for `LLM.sleep`; it makes them again when next used. Default:
        nothing."""


@dataclass
class ForwardContext:
    """What the attention layers of one forward need: the backend, its metadata, the cache."""

    backend: AttentionBackend
    meta: ForwardMeta
    cache: PagedKVCache

    def attend(self, layer: int, q: torch.Tensor, scale: float, window: int | None = None,
               chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The backend's `forward` (window and chunk_kv passed only when given)."""
        extra = {}
        if window is not None:
            extra["window"] = window
        if chunk_kv is not None:
            extra["chunk_kv"] = chunk_kv
        return self.backend.forward(layer, q, scale, self.meta, self.cache, **extra)
