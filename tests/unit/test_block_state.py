"""`BlockState.set_request`: the quotas of the first n + 1 rounds, at a cost bounded by the
block, whatever the round budget."""

from __future__ import annotations

import time

import torch

from dlrt.decoding.schedule import round_quotas
from dlrt.runtime import block_state
from dlrt.runtime.block_state import BlockState


def test_quotas_are_the_first_rounds_of_round_quotas():
    state = BlockState(8, torch.device("cpu"))
    for length in range(1, 9):
        for steps in range(1, 20):
            state.set_request(length, steps, 0)
            want = (round_quotas(length, steps) + [0] * 9)[:9]
            assert state.quotas.tolist() == want, (length, steps)
            assert int(state.steps) == steps


def test_huge_round_budget_is_fast(monkeypatch):
    def bounded(length: int, steps: int) -> list[int]:
        # NOTE: fail at once instead of building a list of `steps` entries (gigabytes)
        assert steps <= length, f"computes {steps} quotas for a block of {length}"
        return round_quotas(length, steps)

    monkeypatch.setattr(block_state, "round_quotas", bounded)
    state = BlockState(8, torch.device("cpu"))
    t0 = time.perf_counter()
    state.set_request(5, 10**9, 3)
    assert time.perf_counter() - t0 < 1.0
    assert state.quotas.tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert int(state.steps) == 10**9 and int(state.seed) == 3
