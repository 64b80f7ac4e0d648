"""Rank 0's calls, shared with the other ranks of a torchrun job (nano-vllm's `call` / `loop`,
vLLM's `collective_rpc`): rank 0 sends each call that does device work before it runs it; the
other ranks run one loop (`Calls.follow`) that receives each call and runs it too, so every rank
makes the same device calls in the same order.

Every message is typed and every exchange is one all-gather over the ranks' gloo control
channel (`Ranks.all_gather`), so each rank sees every rank's message and checks its kind: a
rank that would read a block's status as a call (or a call as a status) stops with `OutOfStep`
instead. The exchanges:

    call      rank 0: Call(name, args, kwargs) or Close(); the others: Ready()
    block     every rank: BlockStatus(error, go_on) after each block of a request (rank 0's
              go_on: the request goes on; a failure on any rank ends it on every rank)
    start     every rank: Start(ids, params) (a request inside collective_rpc: rank 0's wins)
    done      every rank: Done(error, value) at the end of any other call

One process: no exchange; every call runs here alone.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlrt.errors import DlrtError, RankError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_ignored():
    """SIGINT and SIGTERM ignored within (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """Rank 0 -> every rank: run `name(*args, **kwargs)` of the followed object."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Close:
    """Rank 0 -> every rank: close together, then the other ranks end."""


@dataclass(frozen=True)
class Ready:
    """A follower's part of the exchange that carries rank 0's call."""


@dataclass(frozen=True)
class Start:
    """A rank's request inside collective_rpc (every rank adopts rank 0's ids and params)."""

    ids: list
    params: Any


@dataclass(frozen=True)
class BlockStatus:
    """A rank's status after a block: `error` (None: ok) and, from rank 0, whether to go on."""

    error: str | None = None
    go_on: bool | None = None


@dataclass(frozen=True)
class Done:
    """A rank's end of a call: `error` (None: ok) or the call's `value`."""

    error: str | None = None
    value: Any = None


class OutOfStep(RankError):
    """The ranks cannot go on together: the control channel failed (a rank has stopped) or a
    rank received a message of another kind than the exchange expects."""


def describe(e: BaseException) -> str:
    """One line: the exception's type and message."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def on_rank(e: DlrtError, rank: int) -> DlrtError:
    """`e` with its message prefixed by "rank R: " (the same type when it takes a message)."""
    try:
        return type(e)(f"rank {rank}: {e}")
    except TypeError:
        return DlrtError(f"rank {rank}: {describe(e)}")


def _failures(errors: list[str | None], what: str, first: int = 0) -> str:
    return "; ".join(f"rank {first + r} failed {what}: {e}" for r, e in enumerate(errors) if e)


class Request:
    """One request's per-block exchanges (every rank makes exactly one per block, whether the
    block came, the decoder ended or something raised)."""

    def __init__(self, calls: Calls):
        self.calls = calls
        self.open = True

    def end_block(self, go_on: bool) -> bool:
        """After a block: every rank's status; True when the request goes on (rank 0's
        `go_on` and no rank failed). Raises RankError naming the ranks that failed. A closed
        request exchanges nothing and returns False."""
        if not self.open:
            return False
        if self.calls.world == 1:
            self.open = go_on
            return go_on
        statuses = self.calls.exchange(BlockStatus(None, go_on if self.calls.leader else None),
                                       BlockStatus, BlockStatus)
        self.open = bool(statuses[0].go_on) and not any(s.error for s in statuses)
        failed = _failures([s.error for s in statuses], "the request", self.calls.first)
        if failed:
            raise RankError(failed)
        return self.open

    def fail(self, error: BaseException) -> None:
        """This rank failed the request: every rank hears of it (the caller re-raises)."""
        if not self.open:
            return
        self.open = False
        if self.calls.world > 1:
            statuses = self.calls.exchange(BlockStatus(describe(error), False), BlockStatus,
                                           BlockStatus)
            others = [None if r == self.calls.rank else s.error for r, s in enumerate(statuses)]
            if any(others):
                log.error("rank %d: %s", self.calls.me,
                          _failures(others, "the request", self.calls.first))


class Calls:
    """The call protocol of one `LLM` over `ranks` (a `dlrt.distributed.ranks.Ranks`, None in
    one process): `call` (rank 0 sends), `follow` (the others' loop), `start_request` and
    `Request` (per-block statuses), `collective` (every rank runs a function: its values in
    rank order), `close`. `rank` is this process's place among `ranks`; messages name the
    job's ranks (`first`: the global rank of place 0, where `ranks` are some of the job's).

    Inside `collective` every rank makes the calls itself ("in step"): nothing is sent."""

    def __init__(self, ranks=None):
        self.ranks = ranks
        self.world = ranks.world if ranks is not None else 1
        self.rank = ranks.rank if ranks is not None else 0
        self.first = getattr(ranks, "first", 0)
        self.in_step = 0  # nesting depth of `collective`
        self.request: Request | None = None  # the request whose blocks may still come
        self.lost: str | None = None  # why the ranks cannot go on together

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def me(self) -> int:
        """This process's global rank (what messages name)."""
        return self.first + self.rank

    @property
    def sharing(self) -> bool:
        """Whether this rank's calls go to the other ranks (rank 0, not inside `collective`)."""
        return self.world > 1 and self.leader and self.in_step == 0

    def exchange(self, msg: Any, leader_kind: type | tuple, follower_kind: type | tuple) -> list:
        """Every rank's message, in rank order (all ranks call it). Raises OutOfStep when the
        channel fails or a message is not of the kind expected from its rank."""
        if self.lost:
            raise OutOfStep(f"rank {self.me}: the ranks lost step earlier ({self.lost}); "
                            "restart every rank")
        payload = pickle.dumps(msg)  # (a value that cannot be sent raises before any exchange)
        try:
            msgs = [pickle.loads(p) for p in self.ranks.all_gather(payload)]
        except Exception as e:  # gloo: a peer closed its end (it stopped)
            self.lost = f"the control channel failed: {describe(e)}"
            raise OutOfStep(f"rank {self.me}: {self.lost}; another rank has stopped") from e
        for r, m in enumerate(msgs):
            kind = leader_kind if r == 0 else follower_kind
            if not isinstance(m, kind):
                self.lost = (f"rank {self.first + r} sent {type(m).__name__} where "
                             f"{_names(kind)} was expected")
                raise OutOfStep(f"rank {self.me}: the ranks are out of step: {self.lost}")
        return msgs

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Rank 0 outside `collective`: end a request still open (its consumer never asked for
        more), then send the call to the other ranks. Elsewhere: nothing."""
        self.end_request()
        if self.sharing:
            self.exchange(Call(name, args, kwargs), Call, Ready)

    def end_request(self) -> None:
        """Stop the open request on every rank (a newer call supersedes it)."""
        req, self.request = self.request, None
        if req is not None and req.open:
            try:
                req.end_block(False)
            except RankError as e:
                if isinstance(e, OutOfStep):
                    raise
                log.error("rank %d: a superseded request: %s", self.me, e)

    def start_request(self, ids: list[int], params: Any) -> tuple[list[int], Any, Request]:
        """The request's (ids, params) on this rank and its `Request`: rank 0 sends the
        already-checked request (Call "_follow_request"); inside `collective` every rank
        takes rank 0's."""
        if self.in_step and self.world > 1:
            self.end_request()
            first = self.exchange(Start(ids, params), Start, Start)[0]
            ids, params = first.ids, first.params
        elif self.leader:
            self.call("_follow_request", ids, params)
        self.request = Request(self)
        return ids, params, self.request

    def collective(self, what: str, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """`fn(*args, **kwargs)` on every rank (all ranks call this): every rank's value in
        rank order. A failure on any rank raises on every rank: this rank's own exception, else
        RankError naming the ranks that failed `what`."""
        self.in_step += 1
        try:
            value, error = fn(*args, **kwargs), None
        except Exception as e:  # every rank hears of it before it is raised
            value, error = None, e
        finally:
            self.in_step -= 1
        if self.world == 1:
            if error is not None:
                raise error
            return [value]
        mine = Done(describe(error), None) if error is not None else Done(None, value)
        try:
            pickle.dumps(mine)
        except Exception as e:
            mine = Done(f"its value cannot be sent to rank 0: {describe(e)}")
        done = self.exchange(mine, Done, Done)
        if error is not None:
            raise error
        failed = _failures([d.error for d in done], what, self.first)
        if failed:
            raise RankError(failed)
        return [d.value for d in done]

    def receive(self) -> Call | Close:
        """A follower: rank 0's next call."""
        return self.exchange(Ready(), (Call, Close), Ready)[0]

    def follow(self, target: Any, names: frozenset[str]) -> None:
        """A follower's loop: run each of rank 0's calls (`target.<name>`, one of `names`) until
        rank 0 closes (then `target.close()`). A failed call is logged and the loop goes on
        (every rank heard of it); OutOfStep ends the loop. Meanwhile SIGINT and SIGTERM are
        ignored: rank 0 decides when the ranks stop (a Ctrl-C reaches every rank of the
        terminal's process group, and torchrun passes its signal on to every rank)."""
        with _stop_signals_ignored():
            self._follow(target, names)

    def _follow(self, target: Any, names: frozenset[str]) -> None:
        while True:
            msg = self.receive()
            if isinstance(msg, Close):
                target.close()
                return
            if msg.name not in names:
                self.lost = f"rank {self.first} sent an unknown call {msg.name!r}"
                raise OutOfStep(f"rank {self.me}: {self.lost}")
            try:
                getattr(target, msg.name)(*msg.args, **msg.kwargs)
            except OutOfStep:
                raise
            except RankError as e:  # another rank failed it; this one stopped with it
                log.error("rank %d: %s", self.me, e)
            except Exception:
                log.exception("rank %d: %s failed", self.me, msg.name)

    def close(self, release: Callable[[], None]) -> None:
        """Close on every rank: rank 0 tells the others (a rank that cannot be told is
        logged; once the ranks lost step, nobody is told), every rank runs `release`
        (collective: the engine's buffers, in rank order) unless the ranks lost step, then
        leaves the process group (also when ending a request or `release` raises)."""
        try:
            self.end_request()
            if self.sharing and not self.lost:
                try:
                    self.exchange(Close(), Close, Ready)
                except OutOfStep as e:  # (it sets `lost`)
                    log.warning("closing without the other ranks: %s", e)
            if not self.lost:
                release()
        finally:
            if self.ranks is not None:
                self.ranks.close()


def _names(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
