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


class CountingLLM:
    """`stream` yields two one-token blocks, the second the last; records each call's
    options."""

    def __init__(self):
        self.calls: list[dict] = []

    def stream(self, prompt_ids, **options):
        self.calls.append(options)
        yield BlockOutput(0, [1], "a", 1, [0], None, None)
        yield BlockOutput(1, [2], "b", 1, [0], "length", None)


def test_a_job_of_several_runs_streams_each_run_with_its_options_in_one_turn():
    llm = CountingLLM()

    async def scenario():
        worker = Worker(llm, max_queue=0)  # none may wait: the runs share one turn
        job = Job("n", [1], {"temperature": 1.0}, runs=({"seed": 5}, {"seed": 6}, {"seed": 7}))
        events = [event async for event in worker.run(job)]
        assert [kind for kind, _ in events] == ["block", "block", "final"] * 3
        finals = [payload for kind, payload in events if kind == "final"]
        assert [f["completion_tokens"] for f in finals] == [2, 2, 2]
        assert [c["seed"] for c in llm.calls] == [5, 6, 7]
        assert all(c["temperature"] == 1.0 for c in llm.calls)
        await worker.close()

    asyncio.run(scenario())


def test_a_cancelled_job_ends_each_run_left_without_running_it():
    llm = EndlessLLM()

    async def scenario():
        worker = Worker(llm)
        events = worker.run(Job("n", [1], {}, runs=({"seed": 1}, {"seed": 2})))
        await events.__anext__()
        worker.refuse_waiting()
        rest = [event async for event in events]
        finals = [payload for kind, payload in rest if kind == "final"]
        assert [f["finish_reason"] for f in finals] == ["cancelled", "cancelled"]
        assert finals[1]["completion_tokens"] == 0
        await worker.close()

    asyncio.run(scenario())
