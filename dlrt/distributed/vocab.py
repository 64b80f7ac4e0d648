"""A round's candidates from a vocabulary-parallel LM head (`VocabShard`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.decoding.round import RoundKind
from dlrt.decoding.strategies import NEEDS_CREDIT, NEEDS_ENTROPY
from dlrt.distributed.group import TensorParallel


@dataclass(frozen=True)
class VocabShard:
    """The round's candidates from a vocabulary-parallel LM head: this rank's logits are
    [n, V/N], of ids [lo, lo + V/N).

    What a round exchanges, per position and rank:
      - greedy rounds of every strategy but `credit` and `entropy_bounded`: 3 fp32 values
        (the shard's max logit, its id, and the sum of exp(logit - max) over the shard); the
        candidate is the id of the largest max (the lowest rank on a tie: the lowest id, as
        torch's argmax), its confidence exp(0) / sum_r s_r exp(m_r - m) (the softmax maximum);
      - sampled rounds, `credit` (its credit is a [B, V] buffer fused with the logits),
        `entropy_bounded` (the entropy of the full distribution) and rounds that record
        logprobs (the whole distribution's top tokens): the logits, gathered to [n, V] on
        every rank; the round then runs as with one rank. Sampling could exchange
        per-shard Gumbel maxima instead, but its top-k / top-p filters need the global order.
    """

    tp: TensorParallel
    vocab_size: int

    @property
    def lo(self) -> int:
        return self.tp.rank * (self.vocab_size // self.tp.size)

    def local(self, kind: RoundKind) -> bool:
        """Whether a round of `kind` forms its candidates from the shards' summaries."""
        return (kind.sampling.greedy and kind.strategy not in NEEDS_CREDIT | NEEDS_ENTROPY
                and not kind.logprobs)

    def for_round(self, logits: torch.Tensor, kind: RoundKind, candidates_op):
        """(logits, candidates op) for `dlrt.decoding.round.denoise_round`: this rank's
        logits and the sharded greedy op, or the gathered [n, V] logits and `candidates_op`."""
        if self.local(kind):
            return logits, self.greedy
        return self.tp.all_gather(logits), candidates_op

    def greedy(self, logits: torch.Tensor, sampling, mode, round_idx, positions,
               mask_token_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n] int64, confidences [n] fp32) of the whole vocabulary from this rank's
        logits [n, V/N]; the mask token (wherever it lives) is never a candidate."""
        x = logits.float()
        width = x.shape[1]
        mask = mask_token_id - self.lo
        if 0 <= mask < width:
            x = x.clone() if x is logits else x
            x[:, mask] = float("-inf")
        m, idx = x.max(dim=-1)  # [n]
        empty = torch.isneginf(m)  # no finite logit in this shard: it adds nothing
        s = torch.exp(x - torch.where(empty, 0.0, m)[:, None]).sum(dim=-1)
        s = torch.where(empty, 0.0, s)
        mine = torch.stack([m, (idx + self.lo).float(), s], dim=-1)  # [n, 3]
        every = self.tp.all_gather(mine).view(x.shape[0], self.tp.size, 3)
        best = every[:, :, 0].argmax(dim=-1, keepdim=True)  # [n, 1], first max: lowest rank
        top = every[:, :, 0].gather(1, best)  # [n, 1]
        ids = every[:, :, 1].gather(1, best)[:, 0].long()
        scale = torch.exp(every[:, :, 0] - top)
        total = (every[:, :, 2] * torch.where(torch.isneginf(every[:, :, 0]), 0.0, scale)).sum(-1)
        return ids, 1.0 / total

