"""One request at a time per group: a bounded FIFO queue in front of a generation thread per
data-parallel group (the LLM's own and its `other_groups`; one without data parallelism).

`Worker.run(job)` starts at once on an idle group (the one idle longest) when no request
waits; otherwise it waits for its turn, or is refused with `QueueFull` when `max_queue` requests
already wait (0: none may wait). It streams events from its group's generation thread:
("block", BlockOutput) per decided block, then ("final", summary) or ("error", message); a job
of several runs (`Job.runs`) streams them one after another on its one group, each with its
blocks and its "final". Closing the event stream (the client went away) cancels the generation
at the next block boundary; the group is released only when the thread has stopped, so the next
request finds it free. A request that runs longer than `timeout_s` (all its runs together) ends
with finish_reason "timeout". Under torchrun the LLM runs each request on every rank of its
group: closing its stream stops every rank; another group's requests go to that group's leader
(`dlrt.distributed.links`), and a request that fails there fails alone.

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
from collections import deque
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
    one after another in the job's one turn, on its one group, each ending with its own "final"
    event. `group`: the data-parallel group that runs it (set when its turn comes)."""

    rid: str
    prompt_ids: list[int]
    options: dict[str, Any]
    endpoint: str = "generate"
    cancel: threading.Event = field(default_factory=threading.Event)
    defaults: dict[str, Any] = field(default_factory=dict)
    runs: tuple[dict[str, Any], ...] = ({},)
    group: int | None = None


class Worker:
    """The queue and the generation threads of `llm` (its own group) and of its
    `other_groups`, if any; `running` / `waiting`: requests running / waiting;
    `group_running[g]`: group g's running request (0 or 1)."""

    def __init__(self, llm, max_queue: int = 16, timeout_s: float = 600.0):
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.llm = llm
        self.groups = [llm, *getattr(llm, "other_groups", ())]
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.waiting = 0
        self.running = 0
        self.group_running = [0] * len(self.groups)
        self._idle = deque(range(len(self.groups)))  # idle groups, the longest idle first
        self._waiters: deque[asyncio.Future] = deque()  # each resolves to the group it gets
        self._ending: set[int] = set()  # groups whose request has delivered its last event
        self._running: dict[int, tuple[Job, asyncio.Future]] = {}  # group -> job, its thread
        self.refusing = False  # shutting down: waiting requests are refused
        self.lost: str | None = None  # why the LLM can run no more requests (None: it can)
        self._pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlrt-gen")
                       for _ in self.groups]

    async def run(self, job: Job) -> AsyncIterator[tuple[str, Any]]:
        """The job's events, once its turn comes.

        Raises:
            QueueFull: it would wait and `max_queue` requests wait already.
            ShuttingDown: the worker refuses waiting requests (`refuse_waiting`).
        """
        if self.refusing:
            raise ShuttingDown
        # NOTE: a request is busy-refused only if it would wait. It would when another waits
        # (`waiting` also counts a waiter woken but not yet resumed) or no group is idle; a
        # run that has delivered its last event counts as done (its thread is returning), so
        # a client's next request never races the release of its group.
        busy = self.waiting > 0 or not (self._idle or self._ending)
        if busy and self.waiting >= self.max_queue:
            raise QueueFull
        self.waiting += 1
        try:
            group = await self._acquire()
        finally:
            self.waiting -= 1
        if self.refusing:
            self._hand_on(group)
            raise ShuttingDown
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job.group = group
        try:
            self.running += 1
            self.group_running[group] += 1
            fut = loop.run_in_executor(self._pools[group], self._generate, job,
                                       self.groups[group], events, loop)
        except BaseException:
            self.running -= 1
            self.group_running[group] -= 1
            self._hand_on(group)
            raise
        self._running[group] = (job, fut)
        fut.add_done_callback(lambda _: self._release(group))
        try:
            finals = 0
            while True:
                kind, payload = await events.get()
                finals += kind == "final"
                if kind == "error" or finals == len(job.runs):
                    if self._running.get(group, (None,))[0] is job:  # (its thread may be out)
                        self._ending.add(group)
                    yield kind, payload
                    return
                yield kind, payload
        finally:
            job.cancel.set()

    async def _acquire(self) -> int:
        """An idle group, the longest idle first; in FIFO order when requests wait."""
        if self._idle and not self._waiters:
            return self._idle.popleft()
        turn = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            return await turn
        except BaseException:  # the client left while waiting
            if turn.done() and not turn.cancelled():
                self._hand_on(turn.result())
            elif turn in self._waiters:
                self._waiters.remove(turn)
            raise

    def _hand_on(self, group: int) -> None:
        """Give `group` to the first request waiting, else mark it idle."""
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(group)
                return
        self._idle.append(group)

    def _release(self, group: int) -> None:
        self.running -= 1
        self.group_running[group] -= 1
        self._running.pop(group, None)
        self._ending.discard(group)
        self._hand_on(group)

    def refuse_waiting(self) -> None:
        """Refuse the waiting requests (and every later one) with `ShuttingDown` and cancel the
        running ones at their next block (their streams end with finish_reason
        "cancelled")."""
        self.refusing = True
        for job, _ in self._running.values():
            job.cancel.set()

    async def close(self) -> None:
        """`refuse_waiting`, then wait until every generation thread has stopped."""
        self.refuse_waiting()
        if self._running:
            await asyncio.wait([fut for _, fut in self._running.values()])
        for pool in self._pools:
            pool.shutdown(wait=True)

    def close_now(self) -> None:
        """`close` outside the event loop (after it has stopped): blocks until every
        generation thread has stopped."""
        self.refuse_waiting()
        for pool in self._pools:
            pool.shutdown(wait=True)

    def _generate(self, job: Job, group, events: asyncio.Queue, loop) -> None:
        """Generation thread of `group` (an LLM or another group's handle): the job's runs one
        after another (`_run`); an error ends it."""
        def emit(kind, payload):
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
            except RuntimeError:  # the event loop has closed: nobody reads, stop
                job.cancel.set()

        deadline = time.perf_counter() + self.timeout_s
        for i, extra in enumerate(job.runs):
            rid = job.rid if len(job.runs) == 1 else f"{job.rid}/{i}"
            if not self._run(job, group, rid, {**job.options, **extra}, emit, deadline):
                return

    def _run(self, job: Job, group, rid: str, options: dict[str, Any], emit,
             deadline: float) -> bool:
        """One run of the job: stream blocks; close the stream when it ends early (a run that
        starts cancelled or past the deadline runs nothing). False when it failed."""
        t0 = time.perf_counter()
        new = rounds = blocks = 0
        first_block_s = None
        finish, stop_reason, status = None, None, "ok"
        try:
            cancelled = job.cancel.is_set()  # before its start: the client left, or shutdown
            late = not cancelled and t0 > deadline  # an earlier run of the job used the time
            stream = iter(()) if cancelled or late else group.stream(
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
                     "tps=%.1f finish=%s status=%s%s", rid, job.endpoint, len(job.prompt_ids),
                     new, rounds, new / max(total, 1e-9), finish, status,
                     f" group={job.group}" if len(self.groups) > 1 else "")
