"""One denoising round after the forward: candidates, confidences, remasking strategy, commit,
and (LLaDA2.1's joint threshold) edits of decided positions.

Pure tensor code with fixed shapes (no `.item()`, no data-dependent Python branches), shared by
every decoder and execution mode so they commit the same tokens. The candidates and confidences
come from the ops table's `candidates` (the reference below, or `dlrt.ops.triton`'s kernels
straight from the logits), except for strategies that need the entropy of the probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlrt.decoding import rng
from dlrt.decoding.logprobs import TokenLogprobs, round_log_probs
from dlrt.decoding.sampling import SamplingMode, SamplingSpec, candidates, entropy, probabilities
from dlrt.decoding.strategies import (
    NEEDS_CREDIT,
    NEEDS_ENTROPY,
    NEEDS_RANDOM,
    StrategySpec,
    fuse_credit,
    select,
)

# (logits [n, V], sampling, mode, round_idx, positions [n], mask_token_id)
#   -> (ids [n] int64, conf [n] fp32)
CandidatesOp = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class RoundKind:
    """What a round's code does, never with which values: the remasking strategy, the
    sampling mode, whether decided positions may be edited and whether the round records
    the log-probabilities of what it writes. Captured graphs are keyed on it, so every
    request of a kind shares them."""

    strategy: str
    sampling: SamplingMode
    editing: bool = False
    logprobs: bool = False

    def __str__(self) -> str:
        return (f"{self.strategy}/{self.sampling}" + "/editing" * self.editing
                + "/logprobs" * self.logprobs)


@dataclass(frozen=True)
class RoundSpec:
    """What every round of a request shares. Values are host numbers, or 0-d device tensors
    that a request writes before its blocks run (then `mode` must be given)."""

    strategy: StrategySpec
    sampling: SamplingSpec
    steps: int | torch.Tensor  # the round budget T; the last round commits every remaining mask
    mode: SamplingMode | None = None  # None: `SamplingMode.of(sampling)` (host values)
    # edits: rewrite a decided, editable position whose candidate differs from its token, is
    # not `mask_token_id` and has p > editing_threshold. None: no edits (another round kind).
    editing_threshold: float | torch.Tensor | None = None
    mask_token_id: int = -1  # never a candidate (a model constant; -1: none)
    logprobs: bool = False  # record the log-probabilities of the written tokens

    @property
    def kind(self) -> RoundKind:
        return RoundKind(self.strategy.name, self.mode or SamplingMode.of(self.sampling),
                         self.editing_threshold is not None, self.logprobs)


def reference_candidates(logits: torch.Tensor, sampling: SamplingSpec, mode: SamplingMode,
                         round_idx, positions: torch.Tensor, mask_token_id: int = -1
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates [n] int64, confidences [n] fp32) of logits [n, V] through the fp32
    probabilities (`dlrt.decoding.sampling`); `mask_token_id` (-1: none) is never a
    candidate."""
    probs = probabilities(logits, sampling, mode, mask_token_id)  # [n, V] fp32
    return candidates(probs, sampling, round_idx, positions, mode=mode)


def denoise_round(spec: RoundSpec, logits: torch.Tensor, tokens: torch.Tensor,
                  masked: torch.Tensor, positions: torch.Tensor, round_idx, quota,
                  candidates_op: CandidatesOp = reference_candidates,
                  editable: torch.Tensor | None = None, credit: torch.Tensor | None = None,
                  fault: torch.Tensor | None = None, logprobs: TokenLogprobs | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Commit some masked positions of a block and, when the spec edits, rewrite decided ones.

    Mask commits: the strategy's rule on `masked`; the last round of the budget
    (round_idx >= steps - 1) commits every remaining mask. The candidates never include
    `spec.mask_token_id` (its logit is -inf before the softmax), so a commit never writes
    the mask token. Edits (spec.editing_threshold not None; LLaDA2.1 `generate()`): a
    position decided before this round (not `masked`) and `editable` takes the round's
    candidate when it differs from `tokens`, is not `spec.mask_token_id` (also checked here,
    whatever the candidates op), and its confidence is strictly above the editing threshold.
    With the `credit` strategy the candidates (commits and edits alike) are drawn from the
    logits fused with the block's credit (`strategies.fuse_credit`, dInfer's credit decoding),
    after the credit takes this round's plain-softmax argmax and its probability.

    Args:
        logits: [n, V] logits at the block positions (any float dtype).
        tokens: [n] int64 current ids (mask token where masked).
        masked: [n] bool, positions not yet decided (fixed prompt tokens are False).
        positions: [n] int64 absolute positions (keys of the sampling noise).
        round_idx: int or 0-d int64 tensor, round within the block (0-based).
        quota: int or 0-d int64 tensor, this round's quota k.
        candidates_op: the ops table's candidate draw (equal to `reference_candidates`).
        editable: [n] bool, positions an edit may rewrite (not prompt tokens); required when
            the spec edits, ignored otherwise.
        credit: [n, V] fp32, the block's credit (zeroed when the block starts), updated in
            place; required by the `credit` strategy, ignored otherwise.
        fault: 0-d bool, set in place (never cleared) when a masked or editable position's
            confidence is not finite (NaN or infinite logits; no finite logit but the mask
            token's); the host reads it with the block (`BlockState.fault`).
        logprobs: the block's `TokenLogprobs`, where each written position (commit or edit)
            records its token's log-probability under the distribution the round drew it
            from (`dlrt.decoding.logprobs`: the credit-fused logits with `credit`); required
            when the spec records logprobs, ignored otherwise.
    Returns:
        (tokens [n] int64, masked [n] bool, written [n] bool) after the round; `written` is
        the mask commits and the edits of this round (disjoint).
    """
    kind, mask = spec.kind, spec.mask_token_id
    if kind.strategy in NEEDS_CREDIT:
        assert credit is not None, "the credit strategy needs the block's credit buffer"
        top_ids, top_p = candidates_op(logits, spec.sampling, SamplingMode(True), round_idx,
                                       positions, mask)  # the plain softmax's argmax and its p
        logits = fuse_credit(spec.strategy, credit, logits, masked, top_ids, top_p)  # [n, V]
    ent = None
    if kind.strategy in NEEDS_ENTROPY:
        probs = probabilities(logits, spec.sampling, kind.sampling, mask)  # [n, V] fp32
        cand, conf = candidates(probs, spec.sampling, round_idx, positions, mode=kind.sampling)
        ent = entropy(probs)
    else:
        cand, conf = candidates_op(logits, spec.sampling, kind.sampling, round_idx, positions,
                                   mask)
    rand = None
    if kind.strategy in NEEDS_RANDOM:
        rand = rng.uniform(spec.sampling.seed, rng.REMASK_STREAM, round_idx, positions, 1)[:, 0]
    commit = select(spec.strategy, conf, masked, quota, ent, rand)
    last = torch.as_tensor(round_idx, device=masked.device) >= spec.steps - 1
    commit = commit | (masked & last)
    if fault is not None:
        deciding = masked | editable if kind.editing else masked
        fault |= (deciding & ~torch.isfinite(conf)).any()
    if kind.editing:
        edit = (editable & ~masked & (cand != tokens) & (cand != spec.mask_token_id)
                & (conf > spec.editing_threshold))
        commit = commit | edit
    if kind.logprobs:
        assert logprobs is not None, "a round that records logprobs needs their buffers"
        logprobs.record(commit, round_log_probs(logits, spec.sampling, kind.sampling, cand,
                                                mask))
    return torch.where(commit, cand, tokens), masked & ~commit, commit
