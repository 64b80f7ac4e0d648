"""The server's worker stopping, over a stand-in LLM whose stream never ends by itself:
`close` cancels the running request at its next block and returns only once the generation
thread has left the LLM (so the LLM may close after it); waiting and later requests are
refused with `ShuttingDown`."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dlrt.outputs import BlockOutput
from dlrt.server.worker import Job, ShuttingDown, Worker


class EndlessLLM:
    """`stream` yields a one-token block every 20 ms until it is closed."""

    def __init__(self):
        self.inside = threading.Event()  # a thread is in `stream`
        self.left = threading.Event()  # ... and has left it

    def stream(self, prompt_ids, **options):
        self.inside.set()
        try:
            for index in range(10**6):
                time.sleep(0.02)
                yield BlockOutput(index, [1], "x", 1, [0], None, None)
        finally:
            self.left.set()


def test_close_cancels_the_running_request_and_waits_for_its_thread():
    llm = EndlessLLM()

    async def scenario():
        worker = Worker(llm, max_queue=2)
        events = worker.run(Job("running", [1], {}))
        assert (await events.__anext__())[0] == "block"
        waiting = asyncio.ensure_future(worker.run(Job("waiting", [1], {})).__anext__())
        while worker.waiting < 1:
            await asyncio.sleep(0.01)
        await worker.close()
        assert llm.left.is_set()  # the generation thread is out of the LLM
        with pytest.raises(ShuttingDown):
            await waiting
        with pytest.raises(ShuttingDown):
            await worker.run(Job("later", [1], {})).__anext__()
        rest = [event async for event in events]
        assert rest[-1][0] == "final" and rest[-1][1]["finish_reason"] == "cancelled", rest[-1]
        assert (worker.running, worker.waiting) == (0, 0)

    asyncio.run(scenario())


def test_refuse_waiting_keeps_the_worker_open_until_the_running_request_ends():
    """`refuse_waiting` (a second SIGINT) cancels the running request; its client still
    gets the end of its stream."""
    llm = EndlessLLM()

    async def scenario():
        worker = Worker(llm)
        events = worker.run(Job("running", [1], {}))
        await events.__anext__()
        worker.refuse_waiting()
        kinds = [kind async for kind, _ in events]
        assert kinds[-1] == "final"
        await worker.close()

    asyncio.run(scenario())


def test_each_group_runs_a_request_at_once_and_a_waiting_one_takes_the_first_freed():
    """With two data-parallel groups two requests run at once (one per group); a third
    waits (a fourth is refused: `max_queue` 1) and runs on the group freed first."""
    from dlrt.server.worker import QueueFull

    llm = EndlessLLM()
    llm.other_groups, llm.lost = [EndlessLLM()], None

    async def scenario():
        worker = Worker(llm, max_queue=1)
        jobs = [Job(name, [1], {}) for name in "abc"]
        a, b = worker.run(jobs[0]), worker.run(jobs[1])
        assert (await a.__anext__())[0] == (await b.__anext__())[0] == "block"
        assert (worker.running, worker.group_running) == (2, [1, 1])
        assert [j.group for j in jobs[:2]] == [0, 1]
        waiting = asyncio.ensure_future(worker.run(jobs[2]).__anext__())
        while worker.waiting < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await worker.run(Job("d", [1], {})).__anext__()
        await b.aclose()  # b's client leaves: group 1 is freed once its thread stops
        assert (await waiting)[0] == "block" and jobs[2].group == 1
        assert worker.group_running == [1, 1] and worker.waiting == 0
        await worker.close()
        assert (worker.running, worker.group_running) == (0, [0, 0])

    asyncio.run(scenario())
