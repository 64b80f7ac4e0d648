"""MoE routing in one launch: router logits [N, E] -> (weights [N, k] fp32, ids [N, k] int64).

One program per row holds the row's E logits as a [groups, experts per group] tile and picks
the top k by repeated arg-max, ties to the lower index (the reference's stable sort), so the
ids equal `dlrt.layers.moe.reference.route` and the weights agree to fp32 rounding. Rules:

- softmax: probabilities in fp32 over all E (max-shifted exp, divided by their sum); top-k
  on the probabilities; divided by the sum of the k chosen when `renormalize`.
- sigmoid: scores = sigmoid(logits) in fp32; selection on scores + expert_bias; with
  n_group > 1 only the best `topk_group` groups compete (a group's score: the sum of its two
  best biased scores, or its one score for groups of one); weights are the unbiased scores of
  the chosen experts, / (their sum + 1e-20) when k > 1 and `renormalize`, times `scaling`.

Either rule's weights may then be multiplied by a per-expert scale (`expert_scale` [E], any float
dtype, read in fp32: DiffusionGemma's `router.per_expert_scale`), weight j times
expert_scale[ids[j]].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

_BIG = tl.constexpr(2147483647)


@triton.jit
def _first_max(v, idx):
    """(max of v, the lowest idx holding it) over a whole tile."""
    m = tl.max(tl.max(v, axis=1), axis=0)
    return m, tl.min(tl.min(tl.where(v == m, idx, _BIG), axis=1), axis=0)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, scale_ptr, w_ptr, id_ptr, E: tl.constexpr,
                  G: tl.constexpr,
                  GS: tl.constexpr, G_P2: tl.constexpr, GS_P2: tl.constexpr,
                  TOPK: tl.constexpr, K_P2: tl.constexpr, TOPK_GROUP: tl.constexpr,
                  SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                  HAS_SCALE: tl.constexpr, scaling, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G_P2)[:, None]
    c = tl.arange(0, GS_P2)[None, :]
    ok = (g < G) & (c < GS)
    eid = tl.where(ok, g * GS + c, _BIG)  # expert id; padding never matches a real id
    logit = tl.load(logits_ptr + row * E + eid, mask=ok, other=0.0).to(tl.float32)
    if SIGMOID:
        score = 1.0 / (1.0 + tl.exp(-logit))
        sel = score
        if HAS_BIAS:
            sel = score + tl.load(bias_ptr + eid, mask=ok, other=0.0).to(tl.float32)
        sel = tl.where(ok, sel, float("-inf"))
        if G > 1:
            best = tl.max(sel, axis=1)
            at = tl.min(tl.where(sel == best[:, None], c, _BIG), axis=1)
            group = best
            if GS > 1:
                group = best + tl.max(tl.where(c == at[:, None], float("-inf"), sel), axis=1)
            gid = tl.arange(0, G_P2)
            group = tl.where(gid < G, group, float("-inf"))
            keep = gid < 0
            for _ in tl.static_range(TOPK_GROUP):
                m = tl.max(group, axis=0)
                pick = tl.min(tl.where(group == m, gid, _BIG), axis=0)
                keep = keep | (gid == pick)
                group = tl.where(gid == pick, float("-inf"), group)
            sel = tl.where(keep[:, None], sel, float("-inf"))
    else:
        logit = tl.where(ok, logit, float("-inf"))
        e = tl.exp(logit - tl.max(tl.max(logit, axis=1), axis=0))
        score = e / tl.sum(tl.sum(e, axis=1), axis=0)
        sel = tl.where(ok, score, float("-inf"))
    j = tl.arange(0, K_P2)
    weights = tl.zeros([K_P2], tl.float32)
    ids = tl.zeros([K_P2], tl.int64)
    total = 0.0
    for t in tl.static_range(TOPK):
        _, pick = _first_max(sel, eid)
        w = tl.sum(tl.sum(tl.where(eid == pick, score, 0.0), axis=1), axis=0)
        total += w  # in the order chosen
        weights = tl.where(j == t, w, weights)
        ids = tl.where(j == t, pick.to(tl.int64), ids)
        sel = tl.where(eid == pick, float("-inf"), sel)
    if SIGMOID:
        if RENORM and TOPK > 1:
            weights = weights / (total + 1e-20)
        weights = weights * scaling
    elif RENORM:
        weights = weights / total
    if HAS_SCALE:
        weights = weights * tl.load(scale_ptr + ids, mask=j < TOPK, other=0.0).to(tl.float32)
    tl.store(w_ptr + row * TOPK + j, weights, mask=j < TOPK)
    tl.store(id_ptr + row * TOPK + j, ids, mask=j < TOPK)


def route_topk(logits: torch.Tensor, top_k: int, scoring: str, expert_bias: torch.Tensor | None
               = None, renormalize: bool = True, n_group: int = 1, topk_group: int = 1,
               scaling: float = 1.0, expert_scale: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing rule of `dlrt.layers.moe.reference.route` in one kernel.

    Args:
        logits: [N, E] router logits, contiguous (fp32 for "sigmoid", any float dtype for
            "softmax"; computed in fp32).
        expert_bias: [E] (sigmoid only; None: no bias). n_group / topk_group: sigmoid only.
        expert_scale: [E] contiguous, or None: the chosen experts' weights times their scale
            (after the rule's renormalisation and `scaling`).
    Returns:
        (weights [N, top_k] fp32, ids [N, top_k] int64), new tensors.
    """
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(f"route_topk expects contiguous [N, E] logits, got "
                         f"{tuple(logits.shape)}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"unknown scoring {scoring!r}")
    n, e = logits.shape
    groups = n_group if scoring == "sigmoid" else 1
    if e % groups or not 1 <= top_k <= e:
        raise ValueError(f"route_topk: E={e}, top_k={top_k}, n_group={n_group} do not fit")
    if expert_scale is not None and (expert_scale.shape != (e,)
                                     or not expert_scale.is_contiguous()):
        raise ValueError(f"route_topk: expert_scale must be a contiguous [{e}] tensor, got "
                         f"{tuple(expert_scale.shape)}")
    weights = torch.empty((n, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((n, top_k), dtype=torch.int64, device=logits.device)
    if n == 0:
        return weights, ids
    has_bias = scoring == "sigmoid" and expert_bias is not None
    gs = e // groups
    _route_kernel[(n,)](
        logits, expert_bias if has_bias else logits,
        expert_scale if expert_scale is not None else logits, weights, ids, E=e, G=groups, GS=gs,
        G_P2=triton.next_power_of_2(groups), GS_P2=triton.next_power_of_2(gs), TOPK=top_k,
        K_P2=triton.next_power_of_2(top_k), TOPK_GROUP=topk_group if groups > 1 else 1,
        SIGMOID=scoring == "sigmoid", HAS_BIAS=has_bias, RENORM=renormalize,
        HAS_SCALE=expert_scale is not None, scaling=float(scaling),
        num_warps=4 if e >= 256 else 1, **pdl.launch_options(logits))
    return weights, ids
