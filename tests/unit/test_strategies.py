"""Remasking strategies (`dlrt.decoding.strategies.select`), the denoise round and the quota
schedule, on hand-made tensors with exact expected commit masks (DESIGN §3.2, §3.6)."""

from __future__ import annotations

import pytest
import torch

from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingSpec
from dlrt.decoding.schedule import round_quotas
from dlrt.decoding.strategies import STRATEGIES, USES_QUOTA, StrategySpec, select
from dlrt.errors import OptionError

F, T = False, True
EXACT_QUOTA = {"sequential", "low_confidence_static", "random"}


def spec(name: str, threshold: float = 0.9, eb: float = 0.35) -> StrategySpec:
    return StrategySpec(name, threshold, eb)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def b(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


def run(name, conf, masked, quota, threshold=0.9, eb=0.35, entropy=None, rand=None):
    out = select(spec(name, threshold, eb), t(conf), b(masked), quota,
                 None if entropy is None else t(entropy), None if rand is None else t(rand))
    assert out.dtype == torch.bool and out.shape == (len(masked),)
    return out.tolist()


# --- sequential -------------------------------------------------------------------------------

def test_sequential_takes_leftmost_masked_after_fixed_prompt_and_holes():
    # positions 0-1: fixed prompt tokens; 3 and 5: already committed (holes in the mask)
    masked = [F, F, T, F, T, F, T, T]
    conf = [0.9, 0.9, 0.1, 0.9, 0.2, 0.9, 0.99, 0.98]  # confidence must not matter
    assert run("sequential", conf, masked, 1) == [F, F, T, F, F, F, F, F]
    assert run("sequential", conf, masked, 2) == [F, F, T, F, T, F, F, F]
    assert run("sequential", conf, masked, 3) == [F, F, T, F, T, F, T, F]


def test_sequential_quota_clamped_and_zero_becomes_one():
    masked = [F, T, F, T]
    assert run("sequential", [0.5] * 4, masked, 10) == [F, T, F, T]
    assert run("sequential", [0.5] * 4, masked, 0) == [F, T, F, F]


# --- low_confidence_static --------------------------------------------------------------------

def test_low_confidence_static_top_k_among_masked():
    masked = [F, T, T, T, F, T]
    conf = [0.99, 0.2, 0.7, 0.4, 0.95, 0.6]  # unmasked high confidences are ignored
    assert run("low_confidence_static", conf, masked, 1) == [F, F, T, F, F, F]
    assert run("low_confidence_static", conf, masked, 2) == [F, F, T, F, F, T]
    assert run("low_confidence_static", conf, masked, 3) == [F, F, T, T, F, T]


def test_low_confidence_static_ties_broken_by_lower_index():
    masked = [T, T, T, T, T]
    conf = [0.5, 0.75, 0.5, 0.75, 0.5]
    assert run("low_confidence_static", conf, masked, 1) == [F, T, F, F, F]
    assert run("low_confidence_static", conf, masked, 3) == [T, T, F, T, F]
    assert run("low_confidence_static", conf, masked, 4) == [T, T, T, T, F]


# --- low_confidence_dynamic -------------------------------------------------------------------

def test_low_confidence_dynamic_commits_all_above_threshold():
    masked = [T, T, T, T, F, T]
    conf = [0.875, 0.25, 0.9375, 0.625, 0.99, 0.8125]
    # three masked positions > 0.75 with quota 1: all three
    assert run("low_confidence_dynamic", conf, masked, 1, threshold=0.75) == [T, F, T, F, F, T]


def test_low_confidence_dynamic_boundary_is_not_committed():
    masked = [T, T, T]
    conf = [0.75, 0.875, 0.75]  # exactly representable: p == threshold is not "> threshold"
    assert run("low_confidence_dynamic", conf, masked, 1, threshold=0.75) == [F, T, F]
    # only the boundary values: fewer than k above, so the top-1 (lowest index on the tie)
    assert run("low_confidence_dynamic", [0.75, 0.75], [T, T], 1, threshold=0.75) == [T, F]


def test_low_confidence_dynamic_falls_back_to_top_k():
    masked = [T, T, T, T]
    conf = [0.25, 0.875, 0.5, 0.625]
    # one above 0.75 but the quota is 3: the top-3
    assert run("low_confidence_dynamic", conf, masked, 3, threshold=0.75) == [F, T, T, T]
    # none above: still the top-1 with quota 0
    assert run("low_confidence_dynamic", conf, masked, 0, threshold=0.95) == [F, T, F, F]


# --- threshold (LLaDA2 `generate()`: p > threshold, else the single most confident) -------

def test_threshold_commits_all_strictly_above():
    masked = [T, T, T, F, T]
    conf = [0.875, 0.75, 0.5, 1.0, 0.625]  # the unmasked 1.0 is ignored
    assert run("threshold", conf, masked, 1, threshold=0.75) == [T, F, F, F, F]  # 0.75 is not
    assert run("threshold", conf, masked, 1, threshold=0.5) == [T, T, F, F, T]
    # the quota is not used by this strategy
    assert run("threshold", conf, masked, 4, threshold=0.75) == [T, F, F, F, F]


def _ulps(x: float, *steps: int) -> list[float]:
    """fp32 neighbours of x: `steps` ulps away (as exact Python floats)."""
    out = []
    for k in steps:
        v = torch.tensor(x, dtype=torch.float32)
        for _ in range(abs(k)):
            v = torch.nextafter(v, torch.tensor(k * float("inf"), dtype=torch.float32))
        out.append(v.item())
    return out


def test_threshold_near_ties_are_decided_by_the_bar_alone():
    masked = [T, T, T, T]
    p, up, down = _ulps(0.3, 0, 1, -2)
    conf = [p, up, down, 0.1]
    # none above 0.9: only the single most confident, not everything within 1e-5 of it
    assert run("threshold", conf, masked, 1, threshold=0.9) == [F, T, F, F]
    # the fp32 0.3 as the bar: only the one a ulp above it
    assert run("threshold", conf, masked, 1, threshold=p) == [F, T, F, F]
    assert run("threshold", conf, masked, 1, threshold=down) == [T, T, F, F]


def test_threshold_flat_block_commits_one():
    masked = [T] * 6
    assert run("threshold", [0.25] * 6, masked, 6, threshold=0.5) == [T, F, F, F, F, F]
    assert run("threshold", [0.5] * 6, masked, 6, threshold=0.5) == [T, F, F, F, F, F]


def test_threshold_ties_go_to_the_lowest_masked_index():
    masked = [F, T, T, F, T]
    conf = [0.9, 0.125, 0.25, 0.99, 0.25]
    assert run("threshold", conf, masked, 1, threshold=0.9) == [F, F, T, F, F]


def test_threshold_zero_commits_every_masked_position_with_p_above_zero():
    masked = [T, T, F, T, T]
    conf = [1e-30, 0.5, 0.0, 1e-7, 0.0]
    assert run("threshold", conf, masked, 1, threshold=0.0) == [T, T, F, T, F]
    # all masked at p = 0: still one (the lowest index)
    assert run("threshold", [0.0, 0.0, 0.0], [F, T, T], 1, threshold=0.0) == [F, T, F]


def test_threshold_one_commits_only_the_most_confident():
    masked = [T, T, T]
    assert run("threshold", [1.0, 1.0, 0.5], masked, 1, threshold=1.0) == [T, F, F]


# --- entropy_bounded --------------------------------------------------------------------------

def test_entropy_bounded_longest_prefix_below_budget():
    masked = [T, T, T, T, F]
    ent = [0.5, 0.125, 2.0, 0.0625, 0.0]  # unmasked (index 4, entropy 0) must be ignored
    conf = [0.5] * 5
    # ascending: 0.0625 (3), 0.125 (1), 0.5 (0), 2.0 (2); cumulative 0.0625, 0.1875, 0.6875, ...
    assert run("entropy_bounded", conf, masked, 1, eb=0.7, entropy=ent) == [T, T, F, T, F]
    assert run("entropy_bounded", conf, masked, 1, eb=0.6, entropy=ent) == [F, T, F, T, F]
    # boundary: cumulative 0.1875 is not < 0.1875
    assert run("entropy_bounded", conf, masked, 1, eb=0.1875, entropy=ent) == [F, F, F, T, F]


def test_entropy_bounded_at_least_one():
    masked = [T, T, T]
    ent = [3.0, 2.0, 4.0]
    assert run("entropy_bounded", [0.5] * 3, masked, 1, eb=0.1, entropy=ent) == [F, T, F]
    assert run("entropy_bounded", [0.5] * 3, masked, 1, eb=100.0, entropy=ent) == [T, T, T]


# --- dynamic_pmax -----------------------------------------------------------------------------

def test_dynamic_pmax_longest_prefix_with_product_at_least_threshold():
    masked = [T, T, T, T, F]
    conf = [0.5, 1.0, 0.25, 0.5, 1.0]
    # descending (ties by index): 1.0 (1), 0.5 (0), 0.5 (3), 0.25 (2); products 1, .5, .25, .0625
    assert run("dynamic_pmax", conf, masked, 1, threshold=0.25) == [T, T, F, T, F]  # inclusive
    assert run("dynamic_pmax", conf, masked, 1, threshold=0.3) == [T, T, F, F, F]
    assert run("dynamic_pmax", conf, masked, 1, threshold=0.0) == [T, T, T, T, F]


def test_dynamic_pmax_at_least_one():
    masked = [T, T, F]
    conf = [0.25, 0.5, 1.0]
    assert run("dynamic_pmax", conf, masked, 1, threshold=0.9) == [F, T, F]


# --- random -----------------------------------------------------------------------------------

def test_random_takes_k_masked_with_highest_scores():
    masked = [T, F, T, T, T, F]
    rand = [0.3, 0.99, 0.8, 0.1, 0.6, 0.95]  # unmasked scores are ignored
    conf = [0.5] * 6
    assert run("random", conf, masked, 1, rand=rand) == [F, F, T, F, F, F]
    assert run("random", conf, masked, 2, rand=rand) == [F, F, T, F, T, F]
    assert run("random", conf, masked, 3, rand=rand) == [T, F, T, F, T, F]
    assert run("random", conf, masked, 3, rand=rand) == run("random", conf, masked, 3, rand=rand)


def test_random_through_the_round_is_roughly_uniform_over_masked():
    # 4 masked of 8; quota 1; the rng keys (seed) vary. Each masked position should win ~1/4.
    masked = b([F, T, F, T, T, F, T, F])
    rs = RoundSpec(spec("random"), SamplingSpec(0.0, 0, 1.0, 0), steps=8)
    logits = torch.zeros(8, 5)
    tokens = torch.full((8,), 9, dtype=torch.int64)
    positions = torch.arange(100, 108)
    wins = torch.zeros(8)
    n = 800
    for seed in range(n):
        rs = RoundSpec(rs.strategy, SamplingSpec(0.0, 0, 1.0, seed), steps=8)
        _, _, commit = denoise_round(rs, logits, tokens, masked, positions, 0, 1)
        wins += commit.float()
    assert wins[~masked].sum() == 0 and wins.sum() == n
    # binomial(800, 1/4): sd ~12.2; 70 is > 5 sd
    assert torch.all((wins[masked] - n / 4).abs() < 70), wins


# --- shared guarantees ------------------------------------------------------------------------

@pytest.mark.parametrize("name", STRATEGIES)
def test_nothing_committed_without_masks(name):
    n = 5
    out = select(spec(name), torch.rand(n), torch.zeros(n, dtype=torch.bool), 3,
                 torch.rand(n), torch.rand(n))
    assert not out.any()


@pytest.mark.parametrize("name", sorted(EXACT_QUOTA))
def test_quota_tensor_same_as_int(name):
    g = torch.Generator().manual_seed(1)
    conf, ent, rand = (torch.rand(9, generator=g) for _ in range(3))
    masked = torch.rand(9, generator=g) < 0.7
    for q in range(0, 6):
        a = select(spec(name), conf, masked, q, ent, rand)
        c = select(spec(name), conf, masked, torch.tensor(q), ent, rand)
        assert torch.equal(a, c)


def test_property_random_inputs_all_strategies():
    """Subset of masked, at least one while masks remain, exact count for quota strategies."""
    g = torch.Generator().manual_seed(1234)
    for it in range(400):
        n = int(torch.randint(1, 17, (1,), generator=g))
        masked = torch.rand(n, generator=g) < float(torch.rand(1, generator=g))
        # coarse confidences make ties common
        conf = torch.randint(0, 9, (n,), generator=g).float() / 8
        ent = torch.rand(n, generator=g) * 3
        rand = torch.rand(n, generator=g)
        quota = int(torch.randint(0, n + 3, (1,), generator=g))
        threshold = float(torch.rand(1, generator=g))
        eb = float(torch.rand(1, generator=g)) * 2 + 1e-3
        m = int(masked.sum())
        k = min(max(quota, 1), m)
        for name in STRATEGIES:
            commit = select(StrategySpec(name, threshold, eb), conf, masked, quota, ent, rand)
            c = int(commit.sum())
            ctx = (it, name, masked.tolist(), conf.tolist(), quota, threshold, eb)
            assert not (commit & ~masked).any(), ctx
            assert (c >= 1) == (m >= 1), ctx
            if name in EXACT_QUOTA:
                assert c == k, ctx
            if name == "low_confidence_dynamic":
                assert c >= k, ctx


def test_uses_quota_names_known_strategies():
    assert USES_QUOTA <= set(STRATEGIES)
    with pytest.raises(OptionError, match="remasking_strategy"):
        StrategySpec("nope", 0.9, 0.35)


# --- denoise_round ----------------------------------------------------------------------------

MASK = 99


def _round_inputs():
    # 8 positions: 0-1 fixed prompt, 3 committed earlier, the rest masked
    tokens = torch.tensor([11, 12, MASK, 13, MASK, MASK, MASK, MASK])
    masked = tokens == MASK
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 20, generator=g) * 3
    # make the argmax of the unmasked rows differ from their tokens
    logits[[0, 1, 3], 5] = 50.0
    return tokens, masked, logits, torch.arange(40, 48)


@pytest.mark.parametrize("name", STRATEGIES)
def test_denoise_round_never_changes_unmasked_tokens(name):
    tokens, masked, logits, positions = _round_inputs()
    rs = RoundSpec(spec(name, 0.5, 0.5), SamplingSpec(0.0, 0, 1.0, 7), steps=4)
    new, still, commit = denoise_round(rs, logits, tokens, masked, positions, 0, 1,
                                       credit=torch.zeros(logits.shape))
    assert torch.equal(new[~masked], tokens[~masked])
    assert not (commit & ~masked).any() and commit.any()
    assert torch.equal(still, masked & ~commit)
    # greedy: committed tokens are the argmax; still-masked keep the mask token
    assert torch.equal(new[commit], logits.argmax(-1)[commit])
    assert (new[still] == MASK).all()


def test_denoise_round_sampled_never_changes_unmasked_tokens():
    tokens, masked, logits, positions = _round_inputs()
    rs = RoundSpec(spec("low_confidence_static"), SamplingSpec(1.0, 3, 0.9, 5), steps=4)
    new, _, commit = denoise_round(rs, logits, tokens, masked, positions, 1, 2)
    assert torch.equal(new[~masked], tokens[~masked])
    assert int(commit.sum()) == 2
    top3 = logits.topk(3, dim=-1).indices
    assert all(int(new[i]) in top3[i].tolist() for i in torch.nonzero(commit)[:, 0].tolist())


@pytest.mark.parametrize("name", STRATEGIES)
def test_denoise_round_last_round_commits_every_mask(name):
    tokens, masked, logits, positions = _round_inputs()
    # quota 1 and a high threshold / tiny entropy budget would commit one position before
    rs = RoundSpec(spec(name, 1.0, 1e-6), SamplingSpec(0.0, 0, 1.0, 0), steps=4)
    _, still, commit = denoise_round(rs, logits, tokens, masked, positions, 2, 1,
                                     credit=torch.zeros(logits.shape))
    assert int(commit.sum()) < int(masked.sum())
    for r in (3, torch.tensor(3), 5):
        new, still, commit = denoise_round(rs, logits, tokens, masked, positions, r, 1,
                                           credit=torch.zeros(logits.shape))
        assert torch.equal(commit, masked) and not still.any()
        assert torch.equal(new[~masked], tokens[~masked])
        assert torch.equal(new[masked], logits.argmax(-1)[masked])


# --- round_quotas -----------------------------------------------------------------------------

@pytest.mark.parametrize("block, steps, expected", [
    (4, 4, [1, 1, 1, 1]),
    (4, 1, [4]),
    (10, 4, [3, 3, 2, 2]),
    (7, 3, [3, 2, 2]),
    (32, 5, [7, 7, 6, 6, 6]),
    (4, 6, [1, 1, 1, 1, 0, 0]),
    (1, 3, [1, 0, 0]),
])
def test_round_quotas(block, steps, expected):
    assert round_quotas(block, steps) == expected


def test_round_quotas_properties():
    for block in range(1, 70):
        for steps in range(1, 70):
            q = round_quotas(block, steps)
            assert len(q) == steps and sum(q) == block
            base, extra = divmod(block, steps)
            assert q == [base + 1] * extra + [base] * (steps - extra)
