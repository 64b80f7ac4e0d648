"""A job's run as the handlers read it: `start` enters the worker's queue and returns the
job's events (`Worker.run`), each observed by the server's metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from dlrt.server.errors import HTTPError
from dlrt.server.state import ServerState
from dlrt.server.worker import Job, QueueFull, ShuttingDown

Event = tuple[str, Any]


async def start(state: ServerState, job: Job) -> AsyncIterator[Event]:
    """Enter the queue and wait for the job's first event, so that a refusal is still an HTTP
    error: 503 with Retry-After when the queue is full, 503 when the server is shutting down.
    Closing the returned stream cancels the job (`Worker.run`)."""
    worker = state.worker
    events = worker.run(job)
    try:
        first = await events.__anext__()
    except QueueFull:
        raise HTTPError(503, f"server busy: {_running(worker)}, {worker.waiting} waiting "
                             f"(--max-queue {worker.max_queue})",
                        headers={"Retry-After": "1"}) from None
    except ShuttingDown:
        raise HTTPError(503, "server shutting down: the request was not started") from None
    return _observed(state, job, first, events)


async def _observed(state: ServerState, job: Job, first: Event,
                    events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    try:
        state.metrics.observe(*first, job.group)
        yield first
        async for event in events:
            state.metrics.observe(*event, job.group)
            yield event
    finally:
        await events.aclose()


def _running(worker) -> str:
    """"one request running", or "2 requests running (one per data-parallel group)"."""
    n = len(worker.group_running)
    return "one request running" if n == 1 else \
        f"{n} requests running (one per data-parallel group)"
