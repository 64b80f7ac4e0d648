"""Rank 0's link to another data-parallel group's leader: the calls rank 0 hands to that group
(`RemoteGroup`: `generate`, `stream`, `collective_rpc`, `set_execution_mode`, `sleep`,
`wake_up`, `update_weights`, each run by the leader's own LLM, which shares it with its group's
ranks) and the leader's loop that runs them
(`lead`).

The link is a `Calls` over a channel of two ranks (rank 0, place 0; the leader, place 1), so its
messages are typed and checked as every call's are (`dlrt.distributed.calls`). The exchanges:

    call      rank 0: Call("_call" | "_stream", (name, args, kwargs)) or Close(); leader: Ready()
    answer    rank 0: Ready(); leader: Answer(value, error) at the end of a `_call`
    block     rank 0: BlockStatus(None, go_on); leader: Streamed(block, error) for each block of
              a `_stream` (block None: the stream ended); the stream ends on the leader's error,
              its last block (a finish reason), or rank 0's go_on False

A failed call is answered with the leader's exception (or `RankError` naming it when it cannot
be sent); the leader keeps serving. A link that fails (a rank stopped) sets `lost`.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dlrt.distributed.calls import BlockStatus, Calls, OutOfStep, Ready, describe
from dlrt.errors import RankError

log = logging.getLogger(__name__)

# the leader's LLM methods rank 0 may call over a link
CALLED = frozenset({"generate", "collective_rpc", "set_execution_mode", "sleep", "wake_up",
                    "update_weights"})
STREAMED = frozenset({"stream"})


@dataclass(frozen=True)
class Answer:
    """The leader's end of a `_call`: its `value`, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Streamed:
    """The leader's next message of a `_stream`: a `block`, the exception that ended the
    stream, or neither (the stream ended)."""

    block: Any = None
    error: BaseException | None = None


def sendable(error: BaseException, where: str) -> BaseException:
    """`error` when it survives pickling, else a RankError naming it (and `where`)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RankError(f"{where}: {describe(error)}")


class RemoteGroup:
    """Rank 0's handle on data-parallel group `index`, whose leader is global rank `leader`;
    `calls`: the link's `Calls` (rank 0's side). One call runs over a link at a time (a lock);
    `submit` runs one in the link's own thread."""

    def __init__(self, index: int, leader: int, calls: Calls):
        self.index, self.leader, self.calls = index, leader, calls
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dlrt-group{index}")

    @property
    def lost(self) -> str | None:
        """Why this group can run no more requests (its link failed), or None."""
        return self.calls.lost

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The leader's `name(*args, **kwargs)` (one of `CALLED`): its value, or its exception
        raised here."""
        with self._lock:
            self.calls.call("_call", name, args, kwargs)
            answer = self.calls.exchange(Ready(), Ready, Answer)[1]
        if answer.error is not None:
            raise answer.error
        return answer.value

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """`fn(*args, **kwargs)` in the link's own thread (such as `self.call`): its Future."""
        return self._pool.submit(fn, *args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The leader's `LLM.generate`."""
        return self.call("generate", *args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The leader's `LLM.stream`, block for block; closing it stops the leader's stream at
        its next block."""
        with self._lock:
            self.calls.call("_stream", "stream", args, kwargs)
            ended = False
            try:
                while True:
                    msg = self.calls.exchange(BlockStatus(None, True), BlockStatus, Streamed)[1]
                    if msg.error is not None:
                        ended = True
                        raise msg.error
                    if msg.block is None:
                        ended = True
                        return
                    ended = msg.block.finish_reason is not None
                    yield msg.block
                    if ended:
                        return
            finally:
                if not ended and not self.calls.lost:
                    # the leader's next message is discarded; go_on False ends its stream
                    self.calls.exchange(BlockStatus(None, False), BlockStatus, Streamed)

    def close(self) -> None:
        """Stop the link's thread (once its work is done), then tell the leader to close its
        LLM (its group closes with it) and leave the link. A link that failed is not told."""
        self._pool.shutdown(wait=True)
        with self._lock:
            self.calls.close(lambda: None)


class _Leader:
    """The leader's side of a link: runs rank 0's calls on `target` (its LLM)."""

    def __init__(self, calls: Calls, target: Any):
        self.calls, self.target = calls, target

    def _call(self, name: str, args: tuple, kwargs: dict) -> None:
        if name not in CALLED:
            self.calls.lost = f"rank 0 sent an unknown call {name!r}"
            raise OutOfStep(self.calls.lost)
        try:
            answer = Answer(getattr(self.target, name)(*args, **kwargs))
            pickle.dumps(answer)
        except OutOfStep:
            raise
        except Exception as e:  # rank 0 raises it; this group keeps serving
            answer = Answer(None, sendable(e, f"rank {self.calls.me}"))
        self.calls.exchange(answer, Ready, Answer)

    def _stream(self, name: str, args: tuple, kwargs: dict) -> None:
        if name not in STREAMED:
            self.calls.lost = f"rank 0 sent an unknown stream {name!r}"
            raise OutOfStep(self.calls.lost)
        blocks = getattr(self.target, name)(*args, **kwargs)
        try:
            while True:
                try:
                    msg = Streamed(next(blocks, None))
                except OutOfStep:
                    raise
                except Exception as e:
                    msg = Streamed(None, sendable(e, f"rank {self.calls.me}"))
                go_on = self.calls.exchange(msg, BlockStatus, Streamed)[0].go_on
                if msg.block is None or msg.block.finish_reason is not None or not go_on:
                    return
        finally:
            blocks.close()

    def close(self) -> None:
        self.target.close()


def lead(calls: Calls, target: Any) -> None:
    """A data-parallel group's leader (not rank 0): run rank 0's calls on `target` (its LLM)
    until rank 0 closes the link (then `target.close()`). OutOfStep ends the loop (raised)."""
    calls.follow(_Leader(calls, target), frozenset({"_call", "_stream"}))
