"""Candidates and confidences (greedy, temperature, top-k, top-p, Gumbel-max sampling), the
counter-based RNG and entropy, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from dlrt.decoding import rng
from dlrt.decoding.sampling import SamplingSpec, candidates, entropy, probabilities

GREEDY = SamplingSpec(temperature=0.0, top_k=0, top_p=1.0, seed=0)


def sampling(temperature=1.0, top_k=0, top_p=1.0, seed=0) -> SamplingSpec:
    return SamplingSpec(temperature, top_k, top_p, seed)


def hand_softmax(row: list[float]) -> list[float]:
    m = max(row)
    e = [math.exp(x - m) if x != -math.inf else 0.0 for x in row]
    return [v / sum(e) for v in e]


# --- greedy -----------------------------------------------------------------------------------

def test_greedy_candidate_is_argmax_and_confidence_is_max_softmax():
    logits = torch.tensor([[1.0, 3.0, -2.0, 0.5],
                           [0.0, 0.0, 0.1, -5.0],
                           [7.0, 1.0, 2.0, 6.5]])
    probs = probabilities(logits, GREEDY)
    ids, conf = candidates(probs, GREEDY, 0, torch.arange(3))
    assert ids.tolist() == [1, 2, 0]
    for i, row in enumerate(logits.tolist()):
        p = hand_softmax(row)
        assert conf[i].item() == pytest.approx(max(p), rel=1e-6)
        assert probs[i].tolist() == pytest.approx(p, rel=1e-5)
    assert conf.dtype == torch.float32 and ids.dtype == torch.int64


def test_greedy_ignores_top_k_top_p_and_accepts_low_precision_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.bfloat16)
    spec = SamplingSpec(0.0, top_k=1, top_p=0.1, seed=0)
    probs = probabilities(logits, spec)
    assert probs.dtype == torch.float32
    assert probs[0].tolist() == pytest.approx(hand_softmax([2.0, 1.0, 0.0, -1.0]), rel=1e-5)
    ids, conf = candidates(probs, spec, 3, torch.tensor([17]))
    assert ids.tolist() == [0] and conf.item() == pytest.approx(probs[0, 0].item())


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 0.0]])
    probs = probabilities(logits, sampling(temperature=0.5))
    assert probs[0].tolist() == pytest.approx(hand_softmax([2.0, 4.0, 0.0]), rel=1e-5)


# --- top-k / top-p ----------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 1.0],
                           [4.0, -2.0, 0.0, 1.0, 3.5]])
    probs = probabilities(logits, sampling(top_k=2))
    ninf = -math.inf
    assert probs[0].tolist() == pytest.approx(hand_softmax([ninf, 3.0, ninf, 2.0, ninf]))
    assert probs[1].tolist() == pytest.approx(hand_softmax([4.0, ninf, ninf, ninf, 3.5]))
    # k >= vocab: no filter
    full = probabilities(logits, sampling(top_k=99))
    assert torch.allclose(full, torch.softmax(logits, -1))


def _logits_of(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([probs]))


# vocabulary order scrambled: sorted probabilities are 0.5 (1), 0.3 (3), 0.15 (0), 0.05 (2)
SCRAMBLED = [0.15, 0.5, 0.05, 0.3]


@pytest.mark.parametrize("top_p, kept", [
    (0.4, [1]),  # 0.5 crosses 0.4: kept alone
    (0.6, [1, 3]),  # 0.5 + 0.3 crosses 0.6: the crossing token is kept
    (0.9, [1, 3, 0]),  # 0.95 crosses 0.9
    (0.97, [1, 3, 0, 2]),
    (1.0, [1, 3, 0, 2]),  # off
])
def test_top_p_keeps_the_token_crossing_p(top_p, kept):
    probs = probabilities(_logits_of(SCRAMBLED), sampling(top_p=top_p))[0]
    mass = sum(SCRAMBLED[i] for i in kept)
    expected = [SCRAMBLED[i] / mass if i in kept else 0.0 for i in range(4)]
    assert probs.tolist() == pytest.approx(expected, abs=1e-6)


def test_top_p_rows_are_independent():
    logits = torch.cat([_logits_of(SCRAMBLED), _logits_of([0.3, 0.05, 0.15, 0.5])])
    probs = probabilities(logits, sampling(top_p=0.6))
    assert (probs[0] > 0).tolist() == [False, True, False, True]
    assert (probs[1] > 0).tolist() == [True, False, False, True]


def test_top_k_is_applied_before_top_p():
    # top-3 renormalises to 0.5/0.95, 0.3/0.95, 0.15/0.95: cumulative 0.526, 0.842, 1.
    # With p = 0.83 the second token crosses (2 kept); top-p alone would keep 3 (0.8 < 0.83).
    probs = probabilities(_logits_of(SCRAMBLED), sampling(top_k=3, top_p=0.83))[0]
    assert probs.tolist() == pytest.approx([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8], abs=1e-6)
    alone = probabilities(_logits_of(SCRAMBLED), sampling(top_p=0.83))[0]
    assert (alone > 0).tolist() == [True, True, False, True]


def test_top_p_ties_at_the_cut_are_kept_in_token_order():
    # sorted masses 0.4 (id 4), then four ties of 0.15 (ids 0, 2, 3, 5), then 0.0 (id 1):
    # with p = 0.6 the ties preceded by 0.4 and 0.55 are kept (ids 0 and 2), whatever order an
    # unstable sort would give them
    probs_in = [0.15, 1e-9, 0.15, 0.15, 0.4, 0.15]
    probs = probabilities(_logits_of(probs_in), sampling(top_p=0.6))[0]
    assert (probs > 0).tolist() == [True, False, True, False, True, False]
    assert probs[4].item() == pytest.approx(0.4 / 0.7, rel=1e-5)


# --- the counter-based RNG --------------------------------------------------------------------

def test_rng_deterministic_shape_and_range():
    pos = torch.arange(50, 150)
    a = rng.uniform(123, rng.SAMPLE_STREAM, 2, pos, 7)
    b = rng.uniform(123, rng.SAMPLE_STREAM, 2, pos, 7)
    assert a.shape == (100, 7) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert bool((a > 0).all()) and bool((a < 1).all())
    # the same key as 0-d tensors (the form used inside a captured graph)
    c = rng.uniform(torch.tensor(123), rng.SAMPLE_STREAM, torch.tensor(2), pos, 7)
    assert torch.equal(a, c)
    # a position's numbers do not depend on which other positions are asked for
    assert torch.equal(rng.uniform(123, rng.SAMPLE_STREAM, 2, pos[10:11], 7), a[10:11])


@pytest.mark.parametrize("change", ["seed", "round", "position", "stream", "high_seed_bits"])
def test_rng_differs_for_another_key(change):
    pos = torch.arange(0, 256)
    base = dict(seed=5, stream=rng.SAMPLE_STREAM, round_idx=1, positions=pos)
    other = dict(base)
    if change == "seed":
        other["seed"] = 6
    elif change == "round":
        other["round_idx"] = 2
    elif change == "position":
        other["positions"] = pos + 1
    elif change == "stream":
        other["stream"] = rng.REMASK_STREAM
    else:
        other["seed"] = 5 + 2**32  # seeds are validated up to 2^63
    a = rng.uniform(width=4, **base)
    o = rng.uniform(width=4, **other)
    # 24-bit values: an accidental equality has probability ~6e-8 per draw
    assert (a == o).float().mean().item() < 0.01


def test_rng_columns_differ():
    u = rng.uniform(0, rng.SAMPLE_STREAM, 0, torch.arange(64), 8)
    assert (u[:, :-1] == u[:, 1:]).float().mean().item() < 0.01


def test_rng_roughly_uniform():
    n_pos, width = 2000, 50  # 100,000 draws
    u = rng.uniform(42, rng.SAMPLE_STREAM, 0, torch.arange(n_pos), width).flatten()
    assert u.mean().item() == pytest.approx(0.5, abs=0.005)  # sd of the mean: 0.0009
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    expected = u.numel() / 10
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    # chi-square with 9 degrees of freedom: P(chi2 > 40) ~ 7e-6
    assert chi2 < 40, counts
    # successive rounds of one position are not correlated
    r0 = rng.uniform(42, rng.SAMPLE_STREAM, 0, torch.arange(n_pos), 1)[:, 0]
    r1 = rng.uniform(42, rng.SAMPLE_STREAM, 1, torch.arange(n_pos), 1)[:, 0]
    corr = torch.corrcoef(torch.stack([r0, r1]))[0, 1].item()
    assert abs(corr) < 0.1  # sd ~0.022 for 2000 pairs


# --- Gumbel-max sampling ----------------------------------------------------------------------

def test_sampler_draws_the_right_distribution():
    target = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    n = 20000
    probs = target.expand(n, -1).contiguous()
    ids, conf = candidates(probs, sampling(seed=9), 0, torch.arange(n))
    freq = torch.bincount(ids, minlength=6).float() / n
    # Each frequency has sd sqrt(p(1-p)/n) <= 0.0035; 0.015 is > 4 sd for every token.
    assert (freq - target).abs().max().item() < 0.015, freq
    chi2 = (n * (freq - target) ** 2 / target).sum().item()
    assert chi2 < 30, freq  # 5 dof: P(chi2 > 30) ~ 1.5e-5
    # confidence is the probability of the drawn token
    assert torch.equal(conf, target[ids])


def test_sampler_never_draws_a_filtered_token_and_is_keyed():
    logits = torch.tensor([[0.0, 2.0, 1.0, 1.5, -1.0]]).expand(4000, -1)
    spec = sampling(top_k=2, seed=1)
    probs = probabilities(logits, spec)
    ids, _ = candidates(probs, spec, 0, torch.arange(4000))
    assert set(ids.tolist()) == {1, 3}
    again, _ = candidates(probs, spec, 0, torch.arange(4000))
    assert torch.equal(ids, again)
    other, _ = candidates(probs, sampling(top_k=2, seed=2), 0, torch.arange(4000))
    assert not torch.equal(ids, other)
    other_round, _ = candidates(probs, spec, 1, torch.arange(4000))
    assert not torch.equal(ids, other_round)


# --- entropy ----------------------------------------------------------------------------------

def test_entropy_matches_hand_computation():
    probs = torch.tensor([[0.5, 0.25, 0.25, 0.0],
                          [0.25, 0.25, 0.25, 0.25],
                          [1.0, 0.0, 0.0, 0.0],
                          [0.7, 0.2, 0.1, 0.0]])
    h = entropy(probs)
    expected = [1.5 * math.log(2), math.log(4), 0.0,
                -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))]
    assert h.tolist() == pytest.approx(expected, abs=1e-6)
    assert not torch.isnan(h).any()
