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


class CountingLLM:
    """`stream` yields two one-token blocks, the second the last; records each call's
    options; with a `gate`, the first block waits until it is set."""

    def __init__(self, gate: threading.Event | None = None):
        self.calls: list[dict] = []
        self.gate = gate

    def stream(self, prompt_ids, **options):
        self.calls.append(options)
        if self.gate is not None:
            assert self.gate.wait(10)
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


def test_a_job_of_several_runs_runs_them_all_on_its_one_group():
    """With two data-parallel groups a job's runs go back to back on the group it got; a
    request that comes meanwhile runs at once on the other group."""
    gate = threading.Event()
    llm, other = CountingLLM(gate), CountingLLM(gate)
    llm.other_groups, llm.lost = [other], None

    async def events_of(worker, job):
        return [event async for event in worker.run(job)]

    async def scenario():
        worker = Worker(llm, max_queue=0)  # none may wait: each request takes an idle group
        job, single = Job("n", [1], {}, runs=({"seed": 5}, {"seed": 6}, {"seed": 7})), \
            Job("one", [1], {"seed": 9})
        first = asyncio.ensure_future(events_of(worker, job))
        while not llm.calls:
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(events_of(worker, single))
        while not other.calls:
            await asyncio.sleep(0.01)
        assert worker.group_running == [1, 1]
        gate.set()
        events, alone = await first, await second
        assert [kind for kind, _ in events] == ["block", "block", "final"] * 3
        assert [kind for kind, _ in alone] == ["block", "block", "final"]
        assert (job.group, single.group) == (0, 1)
        assert [c["seed"] for c in llm.calls] == [5, 6, 7]
        assert [c["seed"] for c in other.calls] == [9]
        await worker.close()
        assert (worker.running, worker.group_running) == (0, [0, 0])

    asyncio.run(scenario())
