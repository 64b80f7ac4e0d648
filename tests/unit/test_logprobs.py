"""The logprobs a round records (`dlrt.decoding.logprobs`): the chosen token's and the top
alternatives' log-probabilities under the distribution the round drew it from, kept at the
positions it writes (commits and edits), read back once per block with the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from dlrt.decoding.logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, log_probs, unpack
from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingMode, SamplingSpec
from dlrt.decoding.strategies import StrategySpec
from dlrt.runtime.block_state import BlockState

V = 50
MASK = 7


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def _reference(x: torch.Tensor, ids: torch.Tensor):
    """log_softmax in fp64, the chosen ids' and the sorted top."""
    lp = torch.log_softmax(x.double(), dim=-1)
    return lp.gather(1, ids[:, None])[:, 0], lp.sort(dim=-1, descending=True)


def test_log_probs_are_the_log_softmax_with_the_top_sorted():
    x = _logits(6)
    ids = torch.tensor([0, 5, 49, 3, 3, 20])
    chosen, top_ids, top = log_probs(x, ids)
    want, (values, order) = _reference(x, ids)
    assert torch.allclose(chosen.double(), want, atol=1e-5)
    assert top_ids.shape == top.shape == (6, MAX_TOP_LOGPROBS)
    assert torch.equal(top_ids, order[:, :MAX_TOP_LOGPROBS])
    assert torch.allclose(top.double(), values[:, :MAX_TOP_LOGPROBS], atol=1e-5)
    assert (top[:, 1:] <= top[:, :-1]).all()


def test_a_vocabulary_below_the_top_count_is_padded():
    x = torch.randn(3, 5)
    chosen, top_ids, top = log_probs(x, torch.tensor([1, 2, 3]))
    assert (top_ids[:, 5:] == -1).all() and torch.isneginf(top[:, 5:]).all()
    assert torch.allclose(top[:, :5].exp().sum(-1), torch.ones(3), atol=1e-5)


@pytest.mark.parametrize("mode,spec", [
    (SamplingMode(True), SamplingSpec(0.0, 0, 1.0, 3)),
    (SamplingMode(False), SamplingSpec(0.7, 0, 1.0, 3)),
    (SamplingMode(False, top_k=True), SamplingSpec(1.3, 4, 1.0, 3)),
    (SamplingMode(False, top_p=True), SamplingSpec(0.9, 0, 0.6, 3)),
])
def test_a_round_records_the_distribution_it_drew_from(mode, spec):
    """Greedy: the plain softmax (temperature 1); sampled: divided by the temperature and
    filtered (removed tokens at -inf, never listed); the mask token is never a candidate."""
    n = 6
    logits = _logits(n, 1)
    rs = RoundSpec(StrategySpec("low_confidence_static", 0.9, 0.35), spec, steps=2, mode=mode,
                   mask_token_id=MASK, logprobs=True)
    buffers = TokenLogprobs(n, torch.device("cpu"))
    tokens = torch.full((n,), MASK)
    masked = torch.ones(n, dtype=torch.bool)
    new, still, written = denoise_round(rs, logits, tokens, masked, torch.arange(n), 1, 2,
                                        logprobs=buffers)
    assert written.all()  # the last round of the budget commits every mask
    x = logits.double()
    x[:, MASK] = -math.inf
    if not mode.greedy:
        x = x / spec.temperature
    if mode.top_k:
        kth = x.sort(dim=-1, descending=True).values[:, spec.top_k - 1: spec.top_k]
        x = x.masked_fill(x < kth, -math.inf)
    if mode.top_p:
        values, order = x.sort(dim=-1, descending=True)
        before = torch.softmax(values, -1).cumsum(-1) - torch.softmax(values, -1)
        x = x.masked_fill(torch.zeros_like(x, dtype=torch.bool).scatter(
            1, order, before > spec.top_p), -math.inf)
    want, (values, order) = _reference(x, new)
    assert torch.allclose(buffers.logprob.double(), want, atol=1e-5)
    finite = torch.isfinite(values[:, :MAX_TOP_LOGPROBS])
    assert torch.equal(torch.isfinite(buffers.top_logprobs), finite)
    assert torch.allclose(buffers.top_logprobs.double()[finite], values[:, :20][finite],
                          atol=1e-5)
    assert (buffers.top_ids != MASK).all()
    if mode.greedy:  # the argmax is the most likely token
        assert torch.equal(buffers.top_ids[:, 0], new)


def test_only_written_positions_record_and_edits_overwrite():
    n = 4
    rs = RoundSpec(StrategySpec("sequential", 0.9, 0.35), SamplingSpec(0.0, 0, 1.0, 0),
                   steps=4, editing_threshold=0.0, mask_token_id=MASK, logprobs=True)
    buffers = TokenLogprobs(n, torch.device("cpu"))
    tokens = torch.tensor([1, 2, MASK, MASK])
    masked = torch.tensor([False, False, True, True])
    editable = torch.tensor([False, True, True, True])  # position 0: a prompt token
    logits = _logits(n, 2)
    logits[1, 2] = -100.0  # position 1 is edited: its token is not the argmax
    new, still, written = denoise_round(rs, logits, tokens, masked, torch.arange(n), 0, 1,
                                        editable=editable, logprobs=buffers)
    assert written.tolist() == [False, True, True, False]  # an edit and one commit
    want, _ = _reference(logits.masked_fill(torch.arange(V) == MASK, -math.inf), new)
    assert buffers.logprob[0] == 0 and buffers.logprob[3] == 0
    assert torch.allclose(buffers.logprob[1:3].double(), want[1:3], atol=1e-5)


def test_a_kind_without_logprobs_records_nothing_and_needs_no_buffers():
    rs = RoundSpec(StrategySpec("sequential", 0.9, 0.35), SamplingSpec(0.0, 0, 1.0, 0), 4)
    assert not rs.kind.logprobs and str(rs.kind) == "sequential/greedy"
    denoise_round(rs, _logits(2), torch.full((2,), MASK), torch.ones(2, dtype=torch.bool),
                  torch.arange(2), 0, 1)
    on = RoundSpec(rs.strategy, rs.sampling, 4, logprobs=True)
    assert on.kind != rs.kind and str(on.kind) == "sequential/greedy/logprobs"
    with pytest.raises(AssertionError, match="needs their buffers"):
        denoise_round(on, _logits(2), torch.full((2,), MASK), torch.ones(2, dtype=torch.bool),
                      torch.arange(2), 0, 1)


def test_the_packed_read_back_holds_every_bit():
    n = 3
    buffers = TokenLogprobs(n, torch.device("cpu"))
    values = (torch.tensor([-0.0, -1e-30, -87.5]), torch.arange(n * 20).view(n, 20) * 7919,
              torch.tensor([[-float("inf"), -3.25] * 10] * n))
    buffers.record(None, values)
    chosen, ids, top = unpack(buffers.packed(), n)
    assert [math.copysign(1, v) for v in chosen] == [-1, -1, -1]
    assert chosen[1:] == [torch.tensor(-1e-30).item(), -87.5]
    assert ids == values[1].tolist() and top == values[2].tolist()


def test_block_state_reads_back_logprobs_only_when_built_with_them():
    off, on = BlockState(4, torch.device("cpu")), BlockState(4, torch.device("cpu"),
                                                             logprobs=True)
    assert off.logprobs is None and off.readback_async().wait().logprobs is None
    on.tokens.copy_(torch.tensor([9, 8, 7, 6]))
    on.logprobs.logprob.copy_(torch.tensor([-1.0, -2.0, -3.0, -4.0]))
    on.round.fill_(5)
    back = on.readback_async().wait()
    assert back.tokens == [9, 8, 7, 6] and back.rounds == 5
    assert back.logprobs[0] == [-1.0, -2.0, -3.0, -4.0]
    assert len(on.tensors()) == len(off.tensors()) + 3  # restored around a graph's warm-up
    on.start_block()
    assert on.readback_async().wait().logprobs[0] == [0.0] * 4
