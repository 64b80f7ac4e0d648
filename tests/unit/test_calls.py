"""The call protocol of `dlrt.distributed.calls` with threads as ranks (`ThreadChannel`: each
all-gather waits for every rank): rank 0's calls reach the followers' loop, a failure on one
rank is named on every rank, messages of the wrong kind stop both sides instead of being read
as another, a channel that fails ends the follower's loop with one line, and a request's blocks
stop on every rank when rank 0 stops. Under torchrun: `tests/e2e/test_ranks_torchrun.py`."""

from __future__ import annotations

import pickle
import threading

import pytest

from dlrt.distributed.calls import (
    BlockStatus,
    Calls,
    Close,
    Done,
    OutOfStep,
    Ready,
    Request,
)
from dlrt.errors import RankError


class ThreadChannel:
    """`world` ranks' all-gather over threads."""

    def __init__(self, world: int):
        self.world = world
        self.box: list = [None] * world
        self.gate = threading.Barrier(world, timeout=30)

    def rank(self, r: int):
        channel = self

        class Ranks:
            world, rank = channel.world, r

            def all_gather(self, obj):
                channel.gate.wait()
                channel.box[r] = obj
                channel.gate.wait()
                out = list(channel.box)
                channel.gate.wait()
                return out

            def close(self):
                pass

        return Ranks()


def on_ranks(world: int, work) -> list:
    """work(Calls of rank r) on `world` threads: each one's result or exception, rank order."""
    channel, out = ThreadChannel(world), [None] * world

    def one(r: int):
        try:
            out[r] = work(Calls(channel.rank(r)))
        except BaseException as e:  # noqa: BLE001 - returned for the test to check
            out[r] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return out


class Target:
    """What a follower runs: records the calls; `fail` raises on the ranks listed."""

    def __init__(self, calls: Calls):
        self.calls, self.seen, self.closed = calls, [], False

    def work(self, x):
        return self.calls.collective("work", self._work, x)

    def _work(self, x):
        self.seen.append(x)
        return x * 10 + self.calls.rank

    def fail(self, on: tuple):
        def maybe():
            if self.calls.rank in on:
                raise ValueError(f"boom on {self.calls.rank}")
            return "ok"
        return self.calls.collective("fail", maybe)

    def close(self):
        self.closed = True
        self.calls.close(lambda: None)


NAMES = frozenset({"work", "fail"})


def leader_or_follower(script):
    """Rank 0 runs script(target); the others follow; each rank's target (or exception)."""
    def work(calls: Calls):
        target = Target(calls)
        if calls.leader:
            target.result = script(target)
        else:
            calls.follow(target, NAMES)
        return target
    return work


def test_calls_reach_every_rank_and_collect_values_in_rank_order():
    def script(t: Target):
        t.calls.call("work", 4)
        values = t.work(4)
        t.close()
        return values

    r0, r1, r2 = on_ranks(3, leader_or_follower(script))
    assert r0.result == [40, 41, 42]
    assert r0.seen == r1.seen == r2.seen == [4]
    assert r0.closed and r1.closed and r2.closed


def test_a_failure_on_one_rank_is_named_on_every_rank_and_the_next_call_runs(caplog):
    def script(t: Target):
        got = []
        for on in ((1,), (0,), (0, 1)):
            t.calls.call("fail", on)
            try:
                t.fail(on)
            except Exception as e:  # noqa: BLE001 - recorded
                got.append(f"{type(e).__name__}: {e}")
        t.calls.call("work", 1)
        got.append(t.work(1))
        t.close()
        return got

    caplog.set_level("ERROR")
    r0, r1 = on_ranks(2, leader_or_follower(script))
    assert r0.result == ["RankError: rank 1 failed fail: ValueError: boom on 1",
                         "ValueError: boom on 0",  # rank 0's own error
                         "ValueError: boom on 0", [10, 11]]
    assert r1.seen == [1] and r1.closed
    logged = [r.getMessage() for r in caplog.records]
    assert "rank 1: rank 0 failed fail: ValueError: boom on 0" in logged
    assert sum(m.startswith("rank 1: fail failed") for m in logged) == 2  # its own, twice


def test_a_message_of_another_kind_stops_both_sides():
    """Rank 0 sends a call where rank 1 reports a block: neither reads it as the other."""
    def work(calls: Calls):
        if calls.leader:
            return calls.exchange(Close(), (Close,), Ready)
        return calls.exchange(BlockStatus(None), BlockStatus, BlockStatus)

    r0, r1 = on_ranks(2, work)
    assert isinstance(r0, OutOfStep) and isinstance(r1, OutOfStep)
    assert "rank 1 sent BlockStatus where Ready was expected" in str(r0)
    assert "rank 0 sent Close where BlockStatus was expected" in str(r1)


def test_a_failed_channel_ends_the_follower_with_one_line():
    class Gone:
        world, rank = 2, 1

        def all_gather(self, obj):
            raise RuntimeError("Connection closed by peer\nmore detail")

    calls = Calls(Gone())
    with pytest.raises(OutOfStep, match="the control channel failed: RuntimeError: Connection "
                                        "closed by peer more detail; another rank has stopped"):
        calls.follow(Target(calls), NAMES)
    with pytest.raises(OutOfStep, match="lost step earlier"):
        calls.exchange(Done(), Done, Done)

    from dlrt.llm import LLM

    llm = LLM.__new__(LLM)
    llm._calls = calls
    with pytest.raises(SystemExit) as stop:
        llm._follow()
    assert isinstance(stop.value.code, str) and "\n" not in stop.value.code
    assert stop.value.code.startswith("rank 1: the ranks lost step earlier")


def blocks_until_stop(stop_at: int, fail: tuple[int, int] | None):
    """A request's block loop on every rank: rank 0 goes on until block `stop_at`; rank
    fail[0] raises at block fail[1]. Each rank's blocks run, or what it raised."""
    def work(calls: Calls):
        req, blocks = Request(calls), 0
        try:
            while True:
                blocks += 1
                if fail and calls.rank == fail[0] and blocks == fail[1]:
                    raise ValueError(f"rank {fail[0]} broke at block {blocks}")
                if not req.end_block(go_on=blocks < stop_at):
                    return blocks
        except ValueError as e:
            req.fail(e)
            return f"raised at {blocks}"
        except RankError as e:
            return f"{blocks}: {e}"
    return work


def test_a_request_ends_on_every_rank_when_rank_0_stops_or_one_fails():
    assert on_ranks(3, blocks_until_stop(4, None)) == [4, 4, 4]
    named = "3: rank 1 failed the request: ValueError: rank 1 broke at block 3"
    assert on_ranks(3, blocks_until_stop(5, (1, 3))) == [named, "raised at 3", named]
    named = "1: rank 0 failed the request: ValueError: rank 0 broke at block 1"
    assert on_ranks(2, blocks_until_stop(5, (0, 1))) == ["raised at 1", named]


class Recorded:
    """Rank 0's channel to a rank 1 that is gone (the all-gather fails) or answers Ready;
    records `close`."""

    def __init__(self, gone: bool):
        self.world, self.rank, self.gone, self.closed = 2, 0, gone, False

    def all_gather(self, obj):
        if self.gone is None:
            raise AssertionError("an exchange after the ranks lost step")
        if self.gone:
            raise RuntimeError("Connection closed by peer")
        return [obj, pickle.dumps(Ready())]

    def close(self):
        self.closed = True


def test_close_leaves_the_process_group_when_ending_the_request_or_release_raises():
    ranks = Recorded(gone=True)
    calls = Calls(ranks)
    calls.request = Request(calls)  # open: close ends it first, over the failed channel
    with pytest.raises(OutOfStep, match="the control channel failed"):
        calls.close(lambda: None)
    assert ranks.closed

    def release():
        raise RuntimeError("release failed")

    ranks = Recorded(gone=False)
    with pytest.raises(RuntimeError, match="release failed"):
        Calls(ranks).close(release)
    assert ranks.closed


def test_close_after_the_ranks_lost_step_tells_nobody_and_logs_nothing(caplog):
    """The loss was reported when it happened: closing sends nothing (the channel is gone),
    releases nothing (the peers would never meet its barriers) and leaves the group."""
    ranks = Recorded(gone=True)
    calls = Calls(ranks)
    with pytest.raises(OutOfStep):
        calls.call("work", 1)
    ranks.gone = None  # an exchange now would fail differently

    def release():
        raise AssertionError("released after the ranks lost step")

    caplog.set_level("WARNING")
    calls.close(release)
    assert ranks.closed and caplog.records == []


def test_a_follower_leaves_stopping_to_rank_0():
    """While a follower follows, SIGINT and SIGTERM are ignored: a Ctrl-C reaches every rank of
    the terminal's process group and torchrun passes its signal on, and a follower that stopped
    on its own left rank 0 (draining a server's requests) without its ranks. Restored after."""
    import signal

    seen = []
    calls = Calls(ThreadChannel(2).rank(1))

    def receive():
        seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        return Close()

    class Target:
        def close(self):
            pass

    calls.receive = receive
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    calls.follow(Target(), frozenset())
    assert seen == [(signal.SIG_IGN, signal.SIG_IGN)]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
