"""dInfer's parallel decoders as remasking strategies: `credit` and `hierarchical`.

Each rule is written here again as a plain loop over positions (dInfer's
`CreditThresholdParallelDecoder` and `HierarchyDecoder` in `parallel_strategy.py`, with the lowest
index on ties) and compared with the tensor code on random inputs for exact equality of the
committed positions; then hand-made blocks with exact expected commits, and the edge cases.
"""

from __future__ import annotations

import math

import pytest
import torch

from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingSpec
from dlrt.decoding.strategies import StrategySpec, select

F, T = False, True
GREEDY = SamplingSpec(0.0, 0, 1.0, 0)


def f32(x: float) -> float:
    """x rounded to fp32 (the bar a device round compares with), as a Python float."""
    return float(torch.tensor(x, dtype=torch.float32))


def spec(name: str, threshold: float = 0.9, low: float = 0.4, weight: float = 0.7,
         boost: float = 0.2, decay: float = 0.8) -> StrategySpec:
    return StrategySpec(name, threshold, 0.35, low, weight, boost, decay)


def pick(name, conf, masked, threshold=0.9, low=0.4) -> list[bool]:
    out = select(spec(name, threshold, low), torch.tensor(conf, dtype=torch.float32),
                 torch.tensor(masked), 1)
    assert out.dtype == torch.bool and out.shape == (len(masked),)
    return out.tolist()


# --------------------------------------------------------------------------- loop references


def most_confident(conf: list[float], positions: list[int]) -> int:
    return min(positions, key=lambda i: (-conf[i], i))


def ref_hierarchical(conf: list[float], masked: list[bool], threshold: float,
                     low: float) -> list[bool]:
    """dInfer `HierarchyDecoder.get_transfer_index`: each maximal run of masked positions
    commits its most confident position if p > low; every masked p > threshold; the most
    confident masked position always."""
    n = len(conf)
    out = [False] * n
    i = 0
    while i < n:
        if not masked[i]:
            i += 1
            continue
        j = i
        while j < n and masked[j]:
            j += 1
        best = most_confident(conf, list(range(i, j)))
        out[best] = conf[best] > low
        i = j
    for i in range(n):
        out[i] = out[i] or (masked[i] and conf[i] > threshold)
    left = [i for i in range(n) if masked[i]]
    if left:
        out[most_confident(conf, left)] = True
    return out


def ref_credit_select(conf: list[float], masked: list[bool], threshold: float) -> list[bool]:
    """dInfer's threshold rule on the fused confidences: p >= threshold, else the single most
    confident (dInfer: every position within 1e-5 of it)."""
    left = [i for i in range(len(conf)) if masked[i]]
    high = [i for i in left if conf[i] >= threshold]
    chosen = high or ([most_confident(conf, left)] if left else [])
    return [i in chosen for i in range(len(conf))]


class CreditLedger:
    """dInfer's credit matrix as one dict per position {token: credit}, in float64."""

    def __init__(self, n: int, weight: float, boost: float, decay: float):
        self.credit = [dict() for _ in range(n)]
        self.weight, self.boost, self.decay = weight, boost, decay

    def round(self, logits: list[list[float]], masked: list[bool]
              ) -> tuple[list[int], list[float]]:
        """Decay, add p ** boost at each masked position's argmax, fuse; returns the fused
        candidates and their probabilities."""
        cand, conf = [], []
        for i, row in enumerate(logits):
            ledger = self.credit[i]
            for v in ledger:
                ledger[v] *= self.decay
            probs = softmax(row)
            top = max(range(len(row)), key=lambda v: (probs[v], -v))
            if masked[i]:
                ledger[top] = ledger.get(top, 0.0) + probs[top] ** self.boost
            fused = [x + self.weight * math.log(1.0 + ledger.get(v, 0.0))
                     for v, x in enumerate(row)]
            fp = softmax(fused)
            best = max(range(len(row)), key=lambda v: (fp[v], -v))
            cand.append(best)
            conf.append(fp[best])
        return cand, conf


def softmax(row: list[float]) -> list[float]:
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


# --------------------------------------------------------------------------- hierarchical


def test_hierarchical_matches_the_loop_reference_on_random_blocks():
    g = torch.Generator().manual_seed(7)
    for it in range(1500):
        n = int(torch.randint(1, 33, (1,), generator=g))
        masked = (torch.rand(n, generator=g) < float(torch.rand(1, generator=g))).tolist()
        if it % 2:  # coarse confidences: ties within spans and with the bars
            conf = (torch.randint(0, 9, (n,), generator=g).float() / 8).tolist()
            threshold, low = (int(torch.randint(0, 9, (1,), generator=g)) / 8 for _ in "tl")
        else:
            conf = torch.rand(n, generator=g).tolist()
            threshold, low = (f32(float(torch.rand(1, generator=g))) for _ in "tl")
        got = pick("hierarchical", conf, masked, threshold, low)
        assert got == ref_hierarchical(conf, masked, threshold, low), \
            (it, conf, masked, threshold, low)


def test_hierarchical_each_span_commits_its_most_confident_position():
    # spans: [1, 2, 3], [5, 6], [8]; position 0, 4, 7 decided (prompt or earlier rounds)
    masked = [F, T, T, T, F, T, T, F, T]
    conf = [0.99, 0.5, 0.75, 0.625, 0.99, 0.875, 0.25, 0.99, 0.5]
    assert pick("hierarchical", conf, masked, threshold=0.9, low=0.4) == \
        [F, F, T, F, F, T, F, F, T]
    # a span's best at or below low_threshold is not committed (strictly above)
    assert pick("hierarchical", conf, masked, threshold=0.9, low=0.5) == \
        [F, F, T, F, F, T, F, F, F]
    # every masked p above threshold joins, whatever its span
    assert pick("hierarchical", conf, masked, threshold=0.6, low=0.4) == \
        [F, F, T, T, F, T, F, F, T]


def test_hierarchical_over_rounds_splits_the_spans():
    # one span of 7; the middle wins, leaving two spans whose best positions win next
    conf = [0.5, 0.625, 0.5, 0.75, 0.5, 0.4375, 0.5]
    masked = [T] * 7
    first = pick("hierarchical", conf, masked, threshold=0.9, low=0.3)
    assert first == [F, F, F, T, F, F, F]
    masked = [m and not c for m, c in zip(masked, first, strict=True)]
    second = pick("hierarchical", conf, masked, threshold=0.9, low=0.3)
    assert second == [F, T, F, F, T, F, F]  # 4: the first of the tied 0.5s of its span
    masked = [m and not c for m, c in zip(masked, second, strict=True)]
    third = pick("hierarchical", conf, masked, threshold=0.9, low=0.3)
    assert third == [T, F, T, F, F, F, T]


def test_hierarchical_ties_go_to_the_lowest_index_of_a_span():
    masked = [T, T, T, F, T, T]
    conf = [0.5, 0.75, 0.75, 0.9, 0.625, 0.625]
    assert pick("hierarchical", conf, masked, threshold=0.95, low=0.4) == [F, T, F, F, T, F]


def test_hierarchical_below_every_bar_still_commits_the_most_confident():
    masked = [T, T, F, T, T]
    conf = [0.125, 0.25, 0.99, 0.25, 0.0625]
    assert pick("hierarchical", conf, masked, threshold=0.9, low=0.5) == [F, T, F, F, F]


@pytest.mark.parametrize("name", ["hierarchical", "credit"])
def test_one_masked_position_and_none(name):
    assert pick(name, [0.9, 0.01, 0.9], [F, T, F], threshold=0.95, low=0.5) == [F, T, F]
    assert pick(name, [0.5, 0.5, 0.5], [F, F, F]) == [F, F, F]
    assert pick(name, [0.0], [T], threshold=1.0, low=1.0) == [T]


def test_hierarchical_all_masked_is_one_span():
    conf = [0.25, 0.5, 0.375, 0.5]
    assert pick("hierarchical", conf, [T] * 4, threshold=0.9, low=0.4) == [F, T, F, F]
    assert pick("hierarchical", conf, [T] * 4, threshold=0.45, low=0.4) == [F, T, F, T]


# --------------------------------------------------------------------------- credit: the rule


def test_credit_select_matches_the_loop_reference_on_random_confidences():
    g = torch.Generator().manual_seed(3)
    for it in range(1500):
        n = int(torch.randint(1, 33, (1,), generator=g))
        masked = (torch.rand(n, generator=g) < float(torch.rand(1, generator=g))).tolist()
        if it % 2:
            conf = (torch.randint(0, 9, (n,), generator=g).float() / 8).tolist()
            threshold = int(torch.randint(0, 9, (1,), generator=g)) / 8
        else:
            conf = torch.rand(n, generator=g).tolist()
            threshold = f32(float(torch.rand(1, generator=g)))
        assert pick("credit", conf, masked, threshold) == \
            ref_credit_select(conf, masked, threshold), (it, conf, masked, threshold)


def test_credit_select_is_inclusive_and_falls_back_to_the_lowest_most_confident():
    masked = [T, T, F, T]
    assert pick("credit", [0.75, 0.5, 0.99, 0.875], masked, threshold=0.75) == [T, F, F, T]
    assert pick("credit", [0.5, 0.625, 0.99, 0.625], masked, threshold=0.75) == [F, T, F, F]


# --------------------------------------------------------------------------- credit: rounds


def run_credit_block(logits_per_round, masked0, steps=64, **values):
    """Rounds of `denoise_round` with a credit buffer (fresh logits each round), until no
    mask is left; returns the commit mask of every round and the candidates written."""
    n, v = logits_per_round[0].shape
    rs = RoundSpec(spec("credit", **values), GREEDY, steps=steps)
    credit = torch.zeros(n, v)
    tokens = torch.full((n,), -1, dtype=torch.int64)
    masked = torch.tensor(masked0)
    commits = []
    for r, logits in enumerate(logits_per_round):
        if not masked.any():
            break
        tokens, masked, commit = denoise_round(rs, logits, tokens, masked, torch.arange(n),
                                               r, 1, credit=credit)
        commits.append(commit.tolist())
    return commits, tokens.tolist()


def stable_row(p: float, v: int = 4) -> list[float]:
    """Logits of v tokens whose softmax gives token 0 probability p (the rest equal)."""
    return [math.log(p * (v - 1) / (1 - p))] + [0.0] * (v - 1)


def test_credit_rounds_match_the_loop_reference_on_random_logits():
    g = torch.Generator().manual_seed(11)
    checked = complete = 0
    for trial in range(30):
        n, v = int(torch.randint(1, 13, (1,), generator=g)), int(torch.randint(2, 9, (1,),
                                                                                generator=g))
        values = dict(threshold=f32(0.5 + 0.5 * float(torch.rand(1, generator=g))),
                      weight=f32(2 * float(torch.rand(1, generator=g))),
                      boost=f32(float(torch.rand(1, generator=g))),
                      decay=f32(float(torch.rand(1, generator=g))))
        masked0 = (torch.rand(n, generator=g) < 0.8).tolist()
        rounds = [torch.randn(n, v, generator=g) * 2 for _ in range(n + 1)]
        ledger = CreditLedger(n, values["weight"], values["boost"], values["decay"])
        masked, want, tokens = list(masked0), [], [-1] * n
        for logits in rounds:
            if not any(masked):
                break
            cand, conf = ledger.round(logits.double().tolist(), masked)
            if any(abs(c - values["threshold"]) < 1e-5 for c in conf):
                break  # the bar within fp32 noise of a confidence: not decided by the rule
            commit = ref_credit_select(conf, masked, values["threshold"])
            want.append(commit)
            tokens = [c if w else t for t, c, w in zip(tokens, cand, commit, strict=True)]
            masked = [m and not c for m, c in zip(masked, commit, strict=True)]
        got, got_tokens = run_credit_block(rounds, masked0, **values)
        assert got[:len(want)] == want, (trial, values)
        complete += not any(masked)
        if not any(masked):
            assert got_tokens == tokens, (trial, values)
        checked += len(want)
    assert checked > 80 and complete > 20, (checked, complete)


def test_credit_commits_what_the_threshold_alone_would_leave():
    # p = 0.85 at two positions: the plain threshold rule commits one (the lowest index);
    # credit lifts both to ~0.901 >= 0.9 in the first round; 0.5 stays masked.
    logits = torch.tensor([stable_row(0.85), stable_row(0.85), stable_row(0.5)])
    plain = RoundSpec(spec("threshold"), GREEDY, steps=8)
    _, _, commit = denoise_round(plain, logits, torch.zeros(3, dtype=torch.int64),
                                 torch.tensor([T, T, T]), torch.arange(3), 0, 1)
    assert commit.tolist() == [T, F, F]
    commits, tokens = run_credit_block([logits], [T, T, T])
    assert commits == [[T, T, F]] and tokens[:2] == [0, 0]


def test_credit_accumulates_over_the_rounds_of_a_block():
    # p = 0.8 everywhere, unchanged between rounds: fused p is 0.865, then 0.890, then 0.903
    # (credit 0.956, 1.721, 2.334): the fallback commits one in each of the first two rounds,
    # then both remaining positions pass 0.9 together.
    logits = torch.tensor([stable_row(0.8)] * 4)
    commits, _ = run_credit_block([logits] * 4, [T] * 4)
    assert commits == [[T, F, F, F], [F, T, F, F], [F, F, T, T]]
    # without memory (credit_decay 0) the fused p stays 0.865: one per round
    commits, _ = run_credit_block([logits] * 4, [T] * 4, decay=0.0)
    assert commits == [[T, F, F, F], [F, T, F, F], [F, F, T, F], [F, F, F, T]]
    # credit_weight 0 is dInfer's plain threshold decoder
    commits, _ = run_credit_block([logits] * 4, [T] * 4, weight=0.0, threshold=0.79)
    assert commits == [[T, T, T, T]]


def test_credit_goes_to_the_argmax_token_and_can_change_the_candidate():
    # position 0 prefers token 1 (p 0.72) in rounds 0 and 1 and token 0 slightly (logit +0.05)
    # in round 2, where it is committed: plain greedy writes token 0, the credit of token 1
    # (1.35 against 0.87) keeps token 1. Positions 1 and 2 (p 0.99) take the first two rounds.
    early = [[0.0, 1.0, -3.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0]]
    late = [[0.05, 0.0, -3.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0]]
    rounds = [torch.tensor(early), torch.tensor(early), torch.tensor(late)]
    commits, tokens = run_credit_block(rounds, [T, T, T], threshold=1.0)
    assert commits == [[F, T, F], [F, F, T], [T, F, F]]
    assert tokens == [1, 0, 0]
    assert int(rounds[2][0].argmax()) == 0


def test_credit_of_decided_positions_stops_growing():
    # position 1 is decided: its credit row only decays; position 0's grows
    logits = torch.tensor([stable_row(0.5), stable_row(0.5)])
    rs = RoundSpec(spec("credit", threshold=0.99), GREEDY, steps=8)
    credit = torch.zeros(2, 4)
    masked = torch.tensor([T, F])
    tokens = torch.tensor([-1, 0])
    denoise_round(rs, logits, tokens, masked, torch.arange(2), 0, 1, credit=credit)
    assert credit[1].abs().sum() == 0
    assert torch.allclose(credit[0], torch.tensor([0.5 ** 0.2, 0, 0, 0]))
