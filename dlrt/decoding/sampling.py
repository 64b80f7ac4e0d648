"""Candidates and confidences from logits (temperature, top-k, top-p), per masked position.

Greedy (temperature 0): candidate = argmax, confidence = max probability. Sampling: the logits
are divided by the temperature, filtered by top-k then top-p (SDAR `generate.py` order), and
the candidate is drawn by the Gumbel-max trick with counter-based noise (`dlrt.decoding.rng`),
which samples the same distribution as `torch.multinomial`; confidence = its probability.
This is the reference; CUDA rounds take the same draw from `dlrt.kernels.sampling` (no sort,
no [n, V] probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.decoding import rng


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float
    top_k: int  # 0 = off
    top_p: float  # 1.0 = off
    seed: int


def _filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    # stable: of the logits tied at the cut, the lowest token ids are kept first (what a
    # stable CUDA sort gives the reference; dlrt.kernels.sampling keeps the same ones)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = cum > p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def probabilities(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """[n, V] fp32 probabilities after temperature, top-k and top-p (plain softmax if greedy)."""
    x = logits.float()
    if spec.temperature > 0:
        x = x / spec.temperature
        if spec.top_k > 0:
            x = _filter_top_k(x, spec.top_k)
        if spec.top_p < 1.0:
            x = _filter_top_p(x, spec.top_p)
    return torch.softmax(x, dim=-1)


def candidates(probs: torch.Tensor, spec: SamplingSpec, round_idx, positions: torch.Tensor,
               seed=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (candidate ids [n] int64, confidences [n] fp32) from probs [n, V].

    `seed` (int or 0-d int64 tensor) overrides `spec.seed` (captured graphs read it from
    device memory)."""
    if spec.temperature == 0:
        conf, ids = probs.max(dim=-1)
        return ids, conf
    seed = spec.seed if seed is None else seed
    u = rng.uniform(seed, rng.SAMPLE_STREAM, round_idx, positions, probs.shape[-1])
    ids = torch.argmax(probs / -torch.log(u), dim=-1)  # exponential race == Gumbel-max
    return ids, probs.gather(-1, ids[:, None])[:, 0]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of probs [n, V] -> [n] fp32."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)
