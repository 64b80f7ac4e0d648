"""The model runner: one forward of a chunk of tokens against the KV cache."""

from __future__ import annotations

import time

import torch
from torch import nn

from dlrt.attention import AttentionBackend, ForwardContext, ForwardMeta
from dlrt.runtime.kv_cache import PagedKVCache


class ModelRunner:
    """Owns the model, the attention backend and the KV cache of the single request."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, cache: PagedKVCache,
                 device: torch.device):
        self.model = model
        self.backend = backend
        self.cache = cache
        self.device = device
        self.forwards = 0  # forwards run since the last `reset`
        # When a list, every forward synchronises and appends (kind, seconds), kind "round"
        # (no cache write) or "write" (prefill, finished block). For benchmarks only.
        self.timings: list[tuple[str, float]] | None = None

    def reset(self) -> None:
        self.cache.reset()
        self.forwards = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: int, chunk_block: int | None,
                write_len: int = 0, logits_from: int = 0) -> torch.Tensor:
        """Forward tokens [N] at positions start..start+N-1 over the first `start` cached tokens.

        Writes the first `write_len` tokens' K/V into the cache (and advances its length).
        Returns logits [N - logits_from, V] of the positions from `logits_from` on.
        """
        assert start <= self.cache.length, "a forward may only read K/V that the cache holds"
        if self.timings is not None:
            self._sync()
            t0 = time.perf_counter()
        n = tokens.shape[0]
        positions = torch.arange(start, start + n, device=self.device)
        meta = ForwardMeta(ctx_len=start, chunk_block=chunk_block, write_len=write_len)
        hidden = self.model(tokens, positions, ForwardContext(self.backend, meta, self.cache))
        if write_len:
            self.cache.length = start + write_len
        self.forwards += 1
        logits = self.model.logits(hidden[logits_from:])
        if self.timings is not None:
            self._sync()
            self.timings.append(("write" if write_len else "round", time.perf_counter() - t0))
        return logits

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
