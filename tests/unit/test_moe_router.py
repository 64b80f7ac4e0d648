"""The reference MoE router (`dlrt.layers.moe.reference.route`) on hand-made logits: the group
limit, the expert bias, top-1 without renormalisation, the routed scaling factor, ties."""

from __future__ import annotations

import math

import torch

from dlrt.layers.moe.base import RouterSpec
from dlrt.layers.moe.reference import route


def sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def test_group_limit_drops_the_best_expert_of_a_weak_group():
    # groups of two: g0 = {0: 5, 1: -5} sums 1.0, g1 = {2, 3} 1.76, g2 = {4, 5} 1.64, g3 1.0
    logits = torch.tensor([[5.0, -5.0, 2.0, 2.0, 1.5, 1.5, 0.0, 0.0]])
    spec = RouterSpec("sigmoid", 8, 3, n_group=4, topk_group=2)
    _, ids = route(spec, logits, torch.zeros(8))
    assert ids.tolist() == [[2, 3, 4]]
    flat = RouterSpec("sigmoid", 8, 3)  # no group limit: expert 0 wins
    assert route(flat, logits, torch.zeros(8))[1].tolist() == [[0, 2, 3]]


def test_bias_changes_selection_not_weights():
    logits = torch.tensor([[1.0, 0.9, 0.5, 0.0]])
    spec = RouterSpec("sigmoid", 4, 2)
    w0, ids0 = route(spec, logits, torch.zeros(4))
    assert ids0.tolist() == [[0, 1]]
    w, ids = route(spec, logits, torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert ids.tolist() == [[2, 0]]  # biased 1.62 > 0.73
    s2, s0 = sig(0.5), sig(1.0)  # weights from the unbiased scores
    torch.testing.assert_close(w, torch.tensor([[s2 / (s2 + s0), s0 / (s2 + s0)]]))
    torch.testing.assert_close(w0.sum(), torch.tensor(1.0))


def test_top1_is_not_renormalised_and_is_scaled():
    logits = torch.tensor([[0.3, -1.0, 0.2]])
    w, ids = route(RouterSpec("sigmoid", 3, 1, scaling=2.5), logits, torch.zeros(3))
    assert ids.tolist() == [[0]]
    assert math.isclose(w.item(), 2.5 * sig(0.3), rel_tol=1e-6)
    w, _ = route(RouterSpec("softmax", 3, 1), logits, None)  # softmax: renormalised to 1
    assert w.item() == 1.0
    w, _ = route(RouterSpec("softmax", 3, 1, renormalize=False), logits, None)
    p = math.exp(0.3) / sum(math.exp(v) for v in (0.3, -1.0, 0.2))
    assert math.isclose(w.item(), p, rel_tol=1e-6)


def test_scaling_multiplies_renormalised_weights():
    logits = torch.tensor([[0.1, 0.7, -0.4, 0.3]])
    w, ids = route(RouterSpec("sigmoid", 4, 2, scaling=2.5), logits, torch.zeros(4))
    assert ids.tolist() == [[1, 3]]
    assert math.isclose(w.sum().item(), 2.5, rel_tol=1e-6)
    w1, _ = route(RouterSpec("sigmoid", 4, 2, renormalize=False), logits, torch.zeros(4))
    torch.testing.assert_close(w1, torch.tensor([[sig(0.7), sig(0.3)]]))


def test_ties_go_to_the_lower_index():
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 0.0]])
    assert route(RouterSpec("softmax", 6, 2), logits, None)[1].tolist() == [[1, 2]]
    # equal group scores (0.75 + 0.75 == 1.0 + 0.5): the lower group is kept, though the
    # other holds the best expert
    spec = RouterSpec("sigmoid", 6, 1, n_group=3, topk_group=1)
    zeros = torch.zeros(1, 6)  # scores 0.5
    bias = torch.tensor([0.0, 0.0, 0.25, 0.25, 0.5, 0.0])
    assert route(spec, zeros, bias)[1].tolist() == [[2]]
    assert route(RouterSpec("sigmoid", 6, 1), zeros, bias)[1].tolist() == [[4]]
