"""One request at a time: a bounded FIFO queue in front of a single generation thread.

`Worker.run(job)` starts at once when nothing runs or waits; otherwise it waits for its turn,
or is refused with `QueueFull` when `max_queue` requests already wait (0: none may wait). It
streams events from the generation thread: ("block", BlockOutput) per decided block, then
("final", summary) or ("error", message); a job of several runs (`Job.runs`) streams them one
after another, each with its blocks and its "final". Closing the event stream (the client went
away) cancels the generation at the next block boundary; the slot is released only when the
thread has stopped, so the next request finds the device free. A request that runs longer than
`timeout_s` (all its runs together) ends with finish_reason "timeout". Under torchrun the LLM
runs each request on every rank itself: closing its stream stops every rank.

Shutting down: `refuse_waiting` refuses every waiting request (and any later one) with
`ShuttingDown` and cancels the running one at its next block; `close` does that and returns
once the generation thread has stopped, so the LLM can be closed after it.

A request that fails because the LLM can run no more requests (`LLM.lost`: under torchrun, a
rank stopped) sets `lost`: the server stops (`http_server`) and `/health` answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("dlrt.server")


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


class ShuttingDown(Exception):
    """The server is shutting down: a request that would wait (or still waits) is refused."""


@dataclass
class Job:
    """A validated request: prompt token ids, the keyword options it set and the server's
    defaults for the others (`LLM.stream`'s `options` and `defaults`). `runs`: the options of
    each run over `options` (the n choices of an OpenAI request: one seed each); the runs go
    one after another in the job's one turn, each ending with its own "final" event."""

    rid: str
    prompt_ids: list[int]
    options: dict[str, Any]
    endpoint: str = "generate"
    cancel: threading.Event = field(default_factory=threading.Event)
    defaults: dict[str, Any] = field(default_factory=dict)
    runs: tuple[dict[str, Any], ...] = ({},)


class Worker:
    def __init__(self, llm, max_queue: int = 16, timeout_s: float = 600.0):
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.llm = llm
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.waiting = 0
        self.running = 0
        self._lock: asyncio.Lock | None = None
        self._ending = False  # the running request has delivered its last event
        self._running: tuple[Job, asyncio.Future] | None = None  # the job and its thread
        self.refusing = False  # shutting down: waiting requests are refused
        self.lost: str | None = None  # why the LLM can run no more requests (None: it can)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlrt-gen")

    async def run(self, job: Job) -> AsyncIterator[tuple[str, Any]]:
        """The job's events, once its turn comes.

        Raises:
            QueueFull: it would wait and `max_queue` requests wait already.
            ShuttingDown: the worker refuses waiting requests (`refuse_waiting`).
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        if self.refusing:
            raise ShuttingDown
        # NOTE: a request is busy-refused only if it would wait. It would when another waits
        # (`waiting` also counts a waiter woken but not yet resumed, when the lock looks free)
        # or runs; a run that has delivered its last event counts as done (its thread is
        # returning), so a client's next request never races the release of the lock.
        busy = self.waiting > 0 or (self._lock.locked() and not self._ending)
        if busy and self.waiting >= self.max_queue:
            raise QueueFull
        self.waiting += 1
        try:
            await self._lock.acquire()  # FIFO: asyncio.Lock wakes waiters in order
        finally:
            self.waiting -= 1
        if self.refusing:
            self._lock.release()
            raise ShuttingDown
        self._ending = False
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            self.running += 1
            fut = loop.run_in_executor(self._pool, self._generate, job, events, loop)
        except BaseException:
            self.running -= 1
            self._lock.release()
            raise
        self._running = (job, fut)
        fut.add_done_callback(lambda _: self._release())
        try:
            finals = 0
            while True:
                kind, payload = await events.get()
                finals += kind == "final"
                if kind == "error" or finals == len(job.runs):
                    self._ending = True
                    yield kind, payload
                    return
                yield kind, payload
        finally:
            job.cancel.set()

    def _release(self) -> None:
        self.running -= 1
        self._running = None
        self._lock.release()

    def refuse_waiting(self) -> None:
        """Refuse the waiting requests (and every later one) with `ShuttingDown` and cancel the
        running one at its next block (its stream ends with finish_reason "cancelled")."""
        self.refusing = True
        if self._running is not None:
            self._running[0].cancel.set()

    async def close(self) -> None:
        """`refuse_waiting`, then wait until the generation thread has stopped."""
        self.refuse_waiting()
        if self._running is not None:
            await asyncio.wait([self._running[1]])
        self._pool.shutdown(wait=True)

    def close_now(self) -> None:
        """`close` outside the event loop (after it has stopped): blocks until the generation
        thread has stopped."""
        self.refuse_waiting()
        self._pool.shutdown(wait=True)

    def _generate(self, job: Job, events: asyncio.Queue, loop) -> None:
        """Generation thread: the job's runs one after another (`_run`); an error ends it."""
        def emit(kind, payload):
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
            except RuntimeError:  # the event loop has closed: nobody reads, stop
                job.cancel.set()

        deadline = time.perf_counter() + self.timeout_s
        for i, extra in enumerate(job.runs):
            rid = job.rid if len(job.runs) == 1 else f"{job.rid}/{i}"
            if not self._run(job, rid, {**job.options, **extra}, emit, deadline):
                return

    def _run(self, job: Job, rid: str, options: dict[str, Any], emit, deadline: float) -> bool:
        """One run of the job: stream blocks; close the stream when it ends early (a run that
        starts cancelled or past the deadline runs nothing). False when it failed."""
        t0 = time.perf_counter()
        new = rounds = blocks = 0
        first_block_s = None
        finish, stop_reason, status = None, None, "ok"
        try:
            cancelled = job.cancel.is_set()  # before its start: the client left, or shutdown
            late = not cancelled and t0 > deadline  # an earlier run of the job used the time
            stream = iter(()) if cancelled or late else self.llm.stream(
                job.prompt_ids, defaults=job.defaults, **options)
            if cancelled:
                finish, status = "cancelled", "cancelled"
            elif late:
                finish = "timeout"
            for block in stream:
                first_block_s = first_block_s or time.perf_counter() - t0
                new += len(block.token_ids)
                rounds += block.rounds
                blocks += 1
                finish, stop_reason = block.finish_reason, block.stop_reason
                if finish is None and time.perf_counter() > deadline:
                    finish = "timeout"
                if finish is None and job.cancel.is_set():
                    finish, status = "cancelled", "cancelled"
                emit("block", block)
                if finish is not None:
                    stream.close()
                    break
            total = time.perf_counter() - t0
            emit("final", dict(finish_reason=finish, stop_reason=stop_reason,
                               prompt_tokens=len(job.prompt_ids), completion_tokens=new,
                               rounds=rounds, blocks=blocks, request_tps=new / max(total, 1e-9),
                               first_block_s=first_block_s, total_s=total))
            return True
        except Exception as e:  # reported to this client; the server keeps serving
            status = f"error: {type(e).__name__}"
            self.lost = self.llm.lost
            if self.lost is None:
                log.exception("request %s failed", rid)
            # (else the server stops, saying why: no traceback)
            emit("error", f"{type(e).__name__}: {e}")
            return False
        finally:
            total = time.perf_counter() - t0
            log.info("request %s endpoint=%s prompt_tokens=%d new_tokens=%d rounds=%d "
                     "tps=%.1f finish=%s status=%s", rid, job.endpoint, len(job.prompt_ids),
                     new, rounds, new / max(total, 1e-9), finish, status)
