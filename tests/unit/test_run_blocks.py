"""`run_blocks`: blocks in order, launched one ahead of their read-back in graph modes (not
with a host-planned attention backend)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlrt.runtime.decoder import run_blocks
from dlrt.runtime.executor import Executor


def _executor(mode: str, host_planned: bool = False) -> Executor:
    """An executor in `mode` without a device (only its launch policy is used here), over an
    attention backend that does or does not plan on the host."""
    ex = object.__new__(Executor)
    ex.mode = mode
    ex.backend = SimpleNamespace(plans_on_host=host_planned)
    return ex


class FakeState:
    """Read-backs return the index of the last launched block, recording the event order."""

    def __init__(self, log):
        self.log, self.last = log, None

    def readback_async(self):
        k = self.last
        self.log.append(f"copy {k}")
        return SimpleNamespace(wait=lambda: (self.log.append(f"wait {k}"), ([k], [0], 1))[1])


@pytest.mark.parametrize("mode,planned,ahead", [
    ("device_loop", False, True), ("host_loop", False, True), ("eager", False, False),
    ("device_loop", True, False), ("host_loop", True, False)])
def test_order_and_lookahead(mode, planned, ahead):
    log: list[str] = []
    state = FakeState(log)

    def launch(k):
        log.append(f"launch {k}")
        state.last = k

    got = []
    for tokens, _, _ in run_blocks(_executor(mode, planned), state, launch, 3):
        log.append(f"yield {tokens[0]}")
        got.append(tokens[0])
    assert got == [0, 1, 2]
    assert log.count("launch 0") == log.count("launch 1") == log.count("launch 2") == 1
    first_yield = log.index("yield 0")
    assert ("launch 1" in log[:first_yield]) == ahead  # block 1 queued before block 0 is used
    assert "launch 3" not in log  # never past the last block


def test_stopping_early_leaves_at_most_one_block_launched():
    log: list[str] = []
    state = FakeState(log)

    def launch(k):
        log.append(f"launch {k}")
        state.last = k

    blocks = run_blocks(_executor("device_loop"), state, launch, 10)
    next(blocks)
    blocks.close()
    assert [e for e in log if e.startswith("launch")] == ["launch 0", "launch 1"]
