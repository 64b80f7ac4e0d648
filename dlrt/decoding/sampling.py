"""Candidates and confidences from logits (temperature, top-k, top-p), per masked position.

Greedy (temperature 0): candidate = argmax, confidence = max probability. Sampling: the logits
are divided by the temperature, filtered by top-k then top-p (SDAR `generate.py` order), and
the candidate is drawn by the Gumbel-max trick with counter-based noise (`dlrt.decoding.rng`),
which samples the same distribution as `torch.multinomial`; confidence = its probability.
This is the reference; CUDA rounds take the same draw from `dlrt.kernels.sampling` (no sort,
no [n, V] probabilities).

The mask token is never a candidate: given `mask_token_id`, its logit is -inf before anything
else (temperature, filters, softmax), so probabilities and confidences are those of the other
tokens (SGLang's diffusion decoding does the same; the reference `generate()` functions can
commit a mask id, which re-opens the position).

The values of a `SamplingSpec` are host numbers or 0-d device tensors (a captured round reads
them from device memory, so one graph serves every value); what the draw does with them, its
`SamplingMode` (greedy, and which filters are on), is fixed per graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.decoding import rng

Number = float | torch.Tensor  # a host value or a 0-d device tensor

# NOTE: a round divides the fp32 logits by the temperature (multiplies by its reciprocal in
# fp32 on the GPU): past MAX_TEMPERATURE sampling is uniform in all but name and 1e39 is
# infinite in fp32, so larger values are refused; below MIN_TEMPERATURE (SGLang's bar) the
# reciprocal overflows fp32 long before 0, so such a temperature is greedy, as in SGLang.
MIN_TEMPERATURE = 1e-6
MAX_TEMPERATURE = 1e6


@dataclass(frozen=True)
class SamplingSpec:
    temperature: Number  # 0 = greedy
    top_k: int | torch.Tensor  # 0 = off
    top_p: Number  # 1.0 = off
    seed: int | torch.Tensor


@dataclass(frozen=True)
class SamplingMode:
    """What a draw does, never with which values: greedy, or sampled with or without the
    top-k and top-p filters. Part of a captured round's key."""

    greedy: bool
    top_k: bool = False
    top_p: bool = False

    @staticmethod
    def of(spec: SamplingSpec) -> SamplingMode:
        """The mode of a spec of host values (temperature 0 is greedy; top_k 0 and top_p 1
        are off)."""
        if spec.temperature == 0:
            return SamplingMode(True)
        return SamplingMode(False, spec.top_k > 0, spec.top_p < 1.0)

    def __str__(self) -> str:
        if self.greedy:
            return "greedy"
        return "sample" + "+top_k" * self.top_k + "+top_p" * self.top_p


def _filter_top_k(logits: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Keep every logit >= the k-th largest of its row (k an int or a 0-d int64 tensor)."""
    v = logits.shape[-1]
    k = torch.clamp(torch.as_tensor(k, device=logits.device), 1, v)
    ordered = torch.sort(logits, dim=-1, descending=True).values
    kth = ordered.gather(-1, (k - 1).expand(*logits.shape[:-1], 1))
    return logits.masked_fill(logits < kth, float("-inf"))


def _filter_top_p(logits: torch.Tensor, p: Number) -> torch.Tensor:
    # stable: of the logits tied at the cut, the lowest token ids are kept first (what a
    # stable CUDA sort gives the reference; dlrt.kernels.sampling keeps the same ones)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = cum > p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def processed_logits(logits: torch.Tensor, spec: SamplingSpec,
                     mode: SamplingMode | None = None, mask_token_id: int = -1) -> torch.Tensor:
    """[n, V] fp32 logits whose softmax is `probabilities`: the mask token's at -inf, then
    (sampled) divided by the temperature and filtered by top-k then top-p (-inf where
    removed); greedy: the logits as they are (temperature 1, no filter)."""
    mode = mode or SamplingMode.of(spec)
    x = logits.float()
    if mask_token_id >= 0:
        x = x.clone() if x is logits else x
        x[:, mask_token_id] = float("-inf")
    if not mode.greedy:
        x = x / spec.temperature
        if mode.top_k:
            x = _filter_top_k(x, spec.top_k)
        if mode.top_p:
            x = _filter_top_p(x, spec.top_p)
    return x


def probabilities(logits: torch.Tensor, spec: SamplingSpec,
                  mode: SamplingMode | None = None, mask_token_id: int = -1) -> torch.Tensor:
    """[n, V] fp32 probabilities after temperature, top-k and top-p (plain softmax if greedy).
    `mode` is required when the spec holds device tensors (default: `SamplingMode.of(spec)`);
    the token `mask_token_id` (-1: none) gets probability 0."""
    return torch.softmax(processed_logits(logits, spec, mode, mask_token_id), dim=-1)


def candidates(probs: torch.Tensor, spec: SamplingSpec, round_idx, positions: torch.Tensor,
               seed=None, mode: SamplingMode | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (candidate ids [n] int64, confidences [n] fp32) from probs [n, V].

    `seed` (int or 0-d int64 tensor) overrides `spec.seed`; `mode` as in `probabilities`."""
    if (mode or SamplingMode.of(spec)).greedy:
        conf, ids = probs.max(dim=-1)
        return ids, conf
    seed = spec.seed if seed is None else seed
    u = rng.uniform(seed, rng.SAMPLE_STREAM, round_idx, positions, probs.shape[-1])
    ids = torch.argmax(probs / -torch.log(u), dim=-1)  # exponential race == Gumbel-max
    return ids, probs.gather(-1, ids[:, None])[:, 0]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of probs [n, V] -> [n] fp32."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)
