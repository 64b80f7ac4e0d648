"""The model runner: one forward of a chunk of tokens against the paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dlrt.attention.base import AttentionBackend, ForwardContext, ForwardMeta
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.ops import Ops


@dataclass(frozen=True, eq=False)
class ModelRunner:
    """Owns the model, its ops table, the attention backend and the KV cache of the single
    request; every part given at construction, none set afterwards.

    vocab: under tensor parallelism, the LM head's vocabulary shard
        (`dlrt.distributed.vocab.VocabShard`); the logits a forward returns are then this
        rank's [n, V/N]. None: the whole vocabulary.
    persistent: the persistent round kernel (`dlrt.runtime.persistent.kernel.PersistentRounds`
        or anything with its `forward`): it serves the forwards it was built for, the layers
        serve the rest. None: the layers serve every forward.
    """

    model: nn.Module
    ops: Ops
    backend: AttentionBackend
    cache: PagedKVCache
    device: torch.device
    vocab: Any = None
    persistent: Any = None
    _aranges: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def arange(self, n: int) -> torch.Tensor:
        """A static [n] int64 0..n-1 on the device (made before any capture uses it)."""
        if n not in self._aranges:
            self._aranges[n] = torch.arange(n, device=self.device)
        return self._aranges[n]

    def release(self) -> None:
        """Free the runner's device buffers (`LLM.sleep`): its aranges (made again on use)
        and the persistent round's buffers and pointers (`restore` builds them again: the
        weights and the cache may come back at other addresses). The cache, the backend and
        the weights are released by their owners."""
        self._aranges.clear()
        if self.persistent is not None:
            self.persistent.release()

    def restore(self) -> None:
        """After `release`, once the weights and the cache are back: the persistent round
        built again on them."""
        if self.persistent is not None:
            self.persistent.rebuild()

    def lens(self, start: int, kv_len: int) -> torch.Tensor:
        """A fresh (start, kv_len) int32 tensor on the device (eager callers)."""
        return torch.tensor([start, kv_len], dtype=torch.int32, device=self.device)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, lens: torch.Tensor, chunk_block: int | None,
                rows: slice | torch.Tensor | None = None,
                **model_inputs: torch.Tensor) -> torch.Tensor | None:
        """Forward tokens [N] at positions lens[0]..lens[0]+N-1 over cache keys < lens[1].

        Writes the chunk's K/V into the cache (DiffusionGemma's decoder mode, a full chunk,
        writes nothing). Returns logits [n, V] of `rows` (a slice or an index tensor of chunk
        rows; [n, V/N] of the rank's shard when `vocab` is set), or
        None when `rows` is None (no LM head). `model_inputs`: extra inputs of the model's
        forward, passed on (DiffusionGemma's `self_conditioning` [N, V]).
        Pure tensor code: no host sync unless the backend needs one (SDPA).
        """
        if self.persistent is not None and rows is not None and not model_inputs:
            logits = self.persistent.forward(tokens, lens, chunk_block)
            if logits is not None:
                return logits[rows] if isinstance(rows, slice) else logits.index_select(0, rows)
        positions = lens[0].long() + self.arange(tokens.shape[0])
        meta = ForwardMeta(positions, lens, chunk_block)
        hidden = self.model(tokens, positions, ForwardContext(self.backend, meta, self.cache),
                            **model_inputs)
        logits = None
        if rows is not None:
            h = hidden[rows] if isinstance(rows, slice) else hidden.index_select(0, rows)
            logits = self.model.logits(h)
        return logits

    def forward_at(self, tokens: torch.Tensor, start: int, chunk_block: int | None,
                   rows: slice | None = slice(None)) -> torch.Tensor | None:
        """Eager convenience: the chunk at `start`, attending to every key up to its end."""
        return self.forward(tokens, self.lens(start, start + tokens.shape[0]), chunk_block, rows)
