"""Remasking strategies in tensor form: which masked positions a round commits.

Every strategy maps (confidence [n] fp32, masked [n] bool, quota k) to commit [n] bool with no
host sync and fixed shapes, so the same code runs eagerly and inside a captured CUDA graph.
Guarantees for all: commit is a subset of masked; at least one position is committed while any
is masked. Quota-based strategies commit min(k, masks left) positions, at least one.
Definitions follow DESIGN §3.6 (SDAR `generate.py`, dInfer, Fast-dLLM, EB-sampler; `threshold`
is LLaDA2's `generate()` rule with one token to transfer).

- `sequential`: the leftmost k masked positions.
- `low_confidence_static`: the k masked positions of highest p.
- `low_confidence_dynamic`: every masked p > threshold; if fewer than k, the top k by p.
- `threshold`: every masked p > threshold (strictly); if none, the single most confident
  masked position. The quota is not used; threshold 0 commits every masked p > 0.
- `entropy_bounded`: by ascending entropy, the longest prefix whose summed entropy stays
  < eb_threshold (at least one).
- `dynamic_pmax`: by descending p, the longest prefix whose product of p stays >= threshold
  (at least one).
- `random`: k masked positions drawn uniformly (counter-based scores).
- `credit` (dInfer `CreditThresholdParallelDecoder`, `decoding/parallel_strategy.py`): the
  round's candidates and confidences come from the logits fused with the block's credit
  (`fuse_credit`); every masked position with p >= threshold (inclusive, as dInfer's
  `get_transfer_index_threshold`); if none, the single most confident (dInfer: every position
  within 1e-5 of it). The quota is not used.
- `hierarchical` (dInfer `HierarchyDecoder`): the masked positions fall into spans (maximal
  runs of adjacent masked positions); each span's most confident position if its p >
  low_threshold (dInfer: every position tied for the span's max), every masked
  p > threshold, and the most confident masked position always. Committing one position
  inside a span splits it, so over rounds the spans are divided recursively (dInfer's
  divide-and-conquer); within a round the rule is one segmented max of constant depth. The
  quota is not used.
Ties go to the lower index everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.errors import OptionError

STRATEGIES = (
    "sequential",
    "low_confidence_static",
    "low_confidence_dynamic",
    "threshold",
    "entropy_bounded",
    "dynamic_pmax",
    "random",
    "credit",
    "hierarchical",
)
NEEDS_ENTROPY = {"entropy_bounded"}
NEEDS_RANDOM = {"random"}
NEEDS_CREDIT = {"credit"}  # a [B, V] credit buffer that lives through the rounds of a block
USES_QUOTA = {"sequential", "low_confidence_static", "low_confidence_dynamic", "random"}
USES_THRESHOLD = {"low_confidence_dynamic", "threshold", "dynamic_pmax", "credit", "hierarchical"}

# dInfer's defaults (`HierarchyDecoder.low_threshold`; `CreditThresholdParallelDecoder`'s
# credit_alpha, boost_gamma, decay_beta), the values a request gets unless it sets its own.
LOW_THRESHOLD = 0.4
CREDIT_WEIGHT = 0.7
CREDIT_BOOST = 0.2
CREDIT_DECAY = 0.8
MAX_CREDIT_WEIGHT = 100.0  # a logit shift of 100 log(1 + credit) already outweighs any logit

Number = float | torch.Tensor  # a host value or a 0-d device tensor


@dataclass(frozen=True)
class StrategySpec:
    """A remasking strategy and its values (host numbers, or 0-d device tensors a captured
    round reads)."""

    name: str
    threshold: Number  # low_confidence_dynamic, threshold, dynamic_pmax, credit, hierarchical
    eb_threshold: Number  # entropy_bounded
    low_threshold: Number = LOW_THRESHOLD  # hierarchical: the bar of a span's best position
    credit_weight: Number = CREDIT_WEIGHT  # credit: alpha, weight of log(1 + credit)
    credit_boost: Number = CREDIT_BOOST  # credit: gamma, a round adds p ** gamma
    credit_decay: Number = CREDIT_DECAY  # credit: beta, credit kept from one round to the next

    def __post_init__(self):
        if self.name not in STRATEGIES:
            raise OptionError(f"unknown remasking_strategy {self.name!r}; one of {STRATEGIES}")


def _rank(score: torch.Tensor, descending: bool) -> torch.Tensor:
    """Rank of every position by score (0 = first); ties broken by lower index."""
    order = torch.sort(score, descending=descending, stable=True).indices
    return torch.argsort(order)


def _prefix_count(ok_sorted: torch.Tensor, masked_count: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in ok_sorted, clamped to [1, masked_count]."""
    run = torch.cumprod(ok_sorted.to(torch.int64), dim=0).sum()
    return torch.minimum(torch.clamp(run, min=1), masked_count)


def select(spec: StrategySpec, conf: torch.Tensor, masked: torch.Tensor, quota,
           entropy: torch.Tensor | None = None, rand: torch.Tensor | None = None) -> torch.Tensor:
    """Positions to commit this round.

    Args:
        conf: [n] fp32 confidence of each position's candidate (ignored where not masked).
        masked: [n] bool, positions still holding the mask token.
        quota: int or 0-d int64 tensor, this round's quota k (clamped to [1, masks left]).
            Not used by threshold, credit, hierarchical, entropy_bounded, dynamic_pmax.
        entropy: [n] fp32, needed by `entropy_bounded`.
        rand: [n] fp32 uniform scores, needed by `random`.
    Returns:
        [n] bool commit mask.
    """
    n_masked = masked.sum()
    k = torch.minimum(torch.clamp(torch.as_tensor(quota, device=conf.device), min=1), n_masked)
    neg = torch.full_like(conf, float("-inf"))
    score = torch.where(masked, conf, neg)
    name = spec.name
    if name == "sequential":
        return masked & (torch.cumsum(masked.to(torch.int64), 0) <= k)
    if name == "random":
        return masked & (_rank(torch.where(masked, rand, neg), True) < k)
    top_k = masked & (_rank(score, True) < k)
    if name == "low_confidence_static":
        return top_k
    if name == "low_confidence_dynamic":
        high = masked & (conf > spec.threshold)
        return torch.where(high.sum() >= k, high, top_k)
    if name == "threshold":
        high = masked & (conf > spec.threshold)
        return torch.where(high.any(), high, masked & (_rank(score, True) < 1))
    if name == "dynamic_pmax":
        rank = _rank(score, True)
        p_sorted = torch.sort(torch.where(masked, conf, torch.zeros_like(conf)),
                              descending=True, stable=True).values
        count = _prefix_count(torch.cumprod(p_sorted, 0) >= spec.threshold, n_masked)
        return masked & (rank < count)
    if name == "credit":
        high = masked & (conf >= spec.threshold)
        return torch.where(high.any(), high, masked & (_rank(score, True) < 1))
    if name == "hierarchical":
        return _hierarchical(spec, conf, masked, score)
    if name == "entropy_bounded":
        h = torch.where(masked, entropy, torch.full_like(entropy, float("inf")))
        rank = _rank(h, False)
        cum = torch.cumsum(torch.sort(h, stable=True).values, 0)
        count = _prefix_count(cum < spec.eb_threshold, n_masked)
        return masked & (rank < count)
    raise AssertionError(name)


def _hierarchical(spec: StrategySpec, conf: torch.Tensor, masked: torch.Tensor,
                  score: torch.Tensor) -> torch.Tensor:
    """dInfer `HierarchyDecoder.get_transfer_index` on one block, in fixed shapes.

    Spans are maximal runs of adjacent masked positions (span id: a running count of span
    starts). A span's leader is its most confident position, the lowest index on a tie (dInfer
    commits every tied position); scatter-max and scatter-min over span ids, with one spare
    slot for the positions in no span.
    """
    n = conf.shape[0]
    index = torch.arange(n, device=conf.device)
    before = torch.cat([masked.new_zeros(1), masked[:-1]])
    span = torch.cumsum((masked & ~before).to(torch.int64), 0) - 1
    span = torch.where(masked, span, n)  # [n] int64, n = the spare slot
    best = torch.full((n + 1,), float("-inf"), dtype=score.dtype, device=conf.device)
    best = best.scatter_reduce(0, span, score, "amax")
    peak = masked & (score == best.gather(0, span))
    first = torch.full((n + 1,), n, dtype=torch.int64, device=conf.device)
    first = first.scatter_reduce(0, span, torch.where(peak, index, n), "amin")
    leader = masked & (index == first.gather(0, span))
    commit = leader & (conf > spec.low_threshold)
    commit = commit | (masked & (conf > spec.threshold))
    return commit | (masked & (_rank(score, True) < 1))


def fuse_credit(spec: StrategySpec, credit: torch.Tensor, logits: torch.Tensor,
                masked: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor
                ) -> torch.Tensor:
    """One round of dInfer's credit (`CreditThresholdParallelDecoder._apply_credit_fusion`):
    decay the block's credit, add the round's evidence, and return the fused logits.

    credit <- credit * credit_decay; then at each masked position i,
    credit[i, top_ids[i]] += top_p[i] ** credit_boost. The fused logits are
    logits + credit_weight * log(1 + credit). The caller zeroes `credit` when a block starts
    (dInfer keys it on the block and drops it when the generation has no mask left; decaying
    zeros on a block's first round, which dInfer skips, changes nothing).

    Args:
        credit: [n, V] fp32, the block's credit; updated in place.
        logits: [n, V] logits of the round (any float dtype).
        masked: [n] bool, positions still masked before this round's commit.
        top_ids, top_p: [n] int64 and [n] fp32, the argmax token of each position's plain
            softmax (no temperature, no filters) and its probability.
    Returns:
        [n, V] fp32 fused logits, from which the round draws its candidates.
    """
    dev = credit.device
    boost = torch.as_tensor(spec.credit_boost, dtype=torch.float32, device=dev)
    decay = torch.as_tensor(spec.credit_decay, dtype=torch.float32, device=dev)
    weight = torch.as_tensor(spec.credit_weight, dtype=torch.float32, device=dev)
    gain = torch.pow(top_p.float(), boost) * masked  # [n] fp32, 0 where decided
    credit.mul_(decay)
    credit.scatter_add_(1, top_ids[:, None], gain[:, None])
    return logits.float() + weight * torch.log1p(credit)  # [n, V] fp32
