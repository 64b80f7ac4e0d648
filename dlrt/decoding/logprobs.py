"""Log-probabilities of the tokens a round writes, recorded on the device (a request's
`logprobs=True`).

A written token's log-probability is taken under the distribution the round drew it from:
`log_softmax` (fp32) of the round's processed logits (`sampling.processed_logits`): the mask
token's logit at -inf (never a candidate), then, when sampling, divided by the temperature and
filtered by top-k and top-p (removed tokens at -inf); greedy rounds take the logits as they are
(temperature 1, what vLLM reports for greedy decoding). The `credit` strategy draws from the
logits fused with its credit, so those are the ones taken. A renoising canvas (DiffusionGemma)
commits the argmax of its last round's logits divided by that round's temperature: the
log-probability is that token's under their softmax.

Beside it, the `MAX_TOP_LOGPROBS` most likely tokens of the same distribution (ids and
log-probabilities, most likely first); a request keeps the first `top_logprobs` of them.
Pure tensor code with fixed shapes: it runs inside captured rounds.
"""

from __future__ import annotations

import torch

from dlrt.decoding.sampling import SamplingMode, SamplingSpec, processed_logits

MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs


def log_probs(x: torch.Tensor, ids: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of logits x [n, V] fp32 and chosen ids [n] int64: (log-probability of each chosen id
    [n] fp32, the top ids [n, K] int64 and their log-probabilities [n, K] fp32, K =
    MAX_TOP_LOGPROBS, most likely first; past V columns the ids are -1 and the values -inf),
    all of log_softmax(x)."""
    lp = torch.log_softmax(x, dim=-1)  # [n, V] fp32
    chosen = lp.gather(-1, ids[:, None])[:, 0]
    k = min(MAX_TOP_LOGPROBS, x.shape[-1])
    top, top_ids = lp.topk(k, dim=-1)
    if k < MAX_TOP_LOGPROBS:
        pad = MAX_TOP_LOGPROBS - k
        top = torch.cat([top, top.new_full((x.shape[0], pad), float("-inf"))], dim=-1)
        top_ids = torch.cat([top_ids, top_ids.new_full((x.shape[0], pad), -1)], dim=-1)
    return chosen, top_ids, top


def round_log_probs(logits: torch.Tensor, sampling: SamplingSpec, mode: SamplingMode,
                    ids: torch.Tensor, mask_token_id: int = -1
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`log_probs` of a mask-decoding round: of its logits [n, V] (any float dtype) after
    `processed_logits(logits, sampling, mode, mask_token_id)`, for its candidates ids [n]."""
    return log_probs(processed_logits(logits, sampling, mode, mask_token_id), ids)


class TokenLogprobs:
    """Device buffers of n positions: logprob [n] fp32, top_ids [n, K] int64, top_logprobs
    [n, K] fp32 (K = MAX_TOP_LOGPROBS); each position holds what its last write recorded."""

    def __init__(self, n: int, device: torch.device):
        self.n = n
        self.logprob = torch.zeros(n, dtype=torch.float32, device=device)
        self.top_ids = torch.full((n, MAX_TOP_LOGPROBS), -1, dtype=torch.int64, device=device)
        self.top_logprobs = torch.zeros(n, MAX_TOP_LOGPROBS, dtype=torch.float32, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.logprob, self.top_ids, self.top_logprobs]

    def reset(self) -> None:
        """Nothing recorded (device only)."""
        self.logprob.zero_()
        self.top_ids.fill_(-1)
        self.top_logprobs.zero_()

    def record(self, written: torch.Tensor | None,
               values: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Keep `values` (of `log_probs`) at the positions `written` [n] bool (None: all)."""
        chosen, top_ids, top = values
        if written is None:
            self.logprob.copy_(chosen)
            self.top_ids.copy_(top_ids)
            self.top_logprobs.copy_(top)
            return
        w = written[:, None]
        self.logprob.copy_(torch.where(written, chosen, self.logprob))
        self.top_ids.copy_(torch.where(w, top_ids, self.top_ids))
        self.top_logprobs.copy_(torch.where(w, top, self.top_logprobs))

    def packed(self) -> torch.Tensor:
        """[n + 2nK] int64 for a block's read-back: the fp32 values as their bits (int32,
        sign-extended), the ids as they are; `unpack` reads them on the host."""
        bits = torch.cat([self.logprob, self.top_logprobs.flatten()]).view(torch.int32).long()
        n = self.n
        return torch.cat([bits[:n], self.top_ids.flatten(), bits[n:]])


def unpack(flat: torch.Tensor, n: int) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """The host's view of `TokenLogprobs.packed` (flat [n + 2nK] int64 on the CPU):
    (logprob per position, top ids per position, their log-probabilities)."""
    k = MAX_TOP_LOGPROBS
    bits = torch.cat([flat[:n], flat[n + n * k:]]).to(torch.int32).view(torch.float32)
    return (bits[:n].tolist(), flat[n: n + n * k].view(n, k).tolist(),
            bits[n:].view(n, k).tolist())
