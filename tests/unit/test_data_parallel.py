"""Data parallelism without torchrun: the sizes it takes (data_parallel_size x
tensor_parallel_size ranks, a mismatch named), how a list of prompts is shared among the
groups (longest first, greedy by estimated cost), `generate` with a list in one process (one
after another, each as a single `generate`), and rank 0's link to another group's leader over
threads as ranks (calls, streams, failures that leave the leader serving). Under torchrun:
`tests/e2e/test_data_parallel_torchrun.py`, `tests/e2e/test_server_data_parallel.py`."""

from __future__ import annotations

import threading
import time

import pytest
from test_calls import ThreadChannel

from dlrt import LLM
from dlrt.distributed.calls import Calls
from dlrt.distributed.data_parallel import share_by_cost
from dlrt.distributed.links import RemoteGroup, lead
from dlrt.engine.config import EngineConfig
from dlrt.entrypoints.cli import build_parser, engine_kwargs
from dlrt.errors import NumericalError, OptionError, PromptError
from dlrt.outputs import BlockOutput


def test_shares_go_longest_first_to_the_cheapest_group():
    #        0  1  2   3  4  5
    costs = [5, 9, 12, 3, 9, 1]
    # 12 -> g0; 9 (1) -> g1; 9 (4) -> g1 (9 < 12); 5 -> g0 (12 < 18); 3 -> g0 (17 < 18); 1 -> g1
    assert share_by_cost(costs, 2) == [[0, 2, 3], [1, 4, 5]]
    assert share_by_cost(costs, 1) == [[0, 1, 2, 3, 4, 5]]
    assert share_by_cost([4, 4], 3) == [[0], [1], []]
    for groups in (1, 2, 3, 4):
        shares = share_by_cost([7, 1, 1, 3, 8, 2, 2, 6], groups)
        assert sorted(i for s in shares for i in s) == list(range(8))  # each once
    with pytest.raises(ValueError, match="groups=0"):
        share_by_cost([1], 0)


def test_data_parallel_size_times_tensor_parallel_size_must_be_the_ranks(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert EngineConfig.from_kwargs().resolve_device().data_parallel_size == 1
    with pytest.raises(OptionError, match="data_parallel_size=0 must be at least 1"):
        EngineConfig.from_kwargs(data_parallel_size=0)
    with pytest.raises(OptionError, match="data_parallel_size 2 needs a multiple of 2 "
                                          "processes.*without torchrun"):
        EngineConfig.from_kwargs(data_parallel_size=2).resolve_device()
    monkeypatch.setenv("WORLD_SIZE", "4")
    config = EngineConfig.from_kwargs(data_parallel_size=2).resolve_device()
    assert (config.data_parallel_size, config.tensor_parallel_size) == (2, 2)
    assert EngineConfig.from_kwargs(data_parallel_size=4).resolve_device() \
        .tensor_parallel_size == 1
    with pytest.raises(OptionError, match=r"data_parallel_size 2 x tensor_parallel_size 1 "
                                          r"needs 2 processes \(torchrun started 4\)"):
        EngineConfig.from_kwargs(data_parallel_size=2, tensor_parallel_size=1).resolve_device()
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(OptionError, match=r"needs a multiple of 2 processes.*torchrun started 3"):
        EngineConfig.from_kwargs(data_parallel_size=2).resolve_device()
    # without data parallelism, as before: tensor_parallel_size 1 or the world size
    assert EngineConfig.from_kwargs().resolve_device().tensor_parallel_size == 3


def test_the_cli_has_the_flag():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--data-parallel-size", "2"])
    assert engine_kwargs(args)["data_parallel_size"] == 2
    assert engine_kwargs(build_parser().parse_args(["serve"]))["data_parallel_size"] == 1


@pytest.fixture(scope="module")
def llm(tiny_sdar):
    return LLM(tiny_sdar, dtype="float32")


def test_a_list_of_prompts_gives_each_prompt_its_own_result_in_order(llm):
    prompts = ["def add(a, b):", "import os", "x = 1"]
    opts = dict(max_new_tokens=8, temperature=0.0)
    results = llm.generate(prompts, **opts)
    assert [r.token_ids for r in results] == [llm.generate(p, **opts).token_ids
                                              for p in prompts]
    chats = [[{"role": "user", "content": p}] for p in prompts[:2]]
    assert [r.text for r in llm.generate(chats, **opts)] == \
        [llm.generate(c, **opts).text for c in chats]
    ids = [[5, 6, 7], [8, 9]]
    assert [r.token_ids for r in llm.generate(ids, **opts)] == \
        [llm.generate(i, **opts).token_ids for i in ids]
    one = llm.generate(prompts[0], **opts)  # one prompt: one result, as before
    assert one.token_ids == results[0].token_ids
    assert llm.share(prompts, **opts) == [[0, 1, 2]]


def test_a_bad_prompt_in_a_list_is_refused_before_any_runs(llm, monkeypatch):
    ran = []
    real = llm._run
    monkeypatch.setattr(llm, "_run", lambda *a: ran.append(1) or real(*a))
    with pytest.raises(PromptError, match="prompt 1: prompt is empty"):
        llm.generate(["def f():", "", "x"], max_new_tokens=4)
    with pytest.raises(OptionError, match="temperature"):
        llm.generate(["def f():", "x"], max_new_tokens=4, temperature=-1)
    assert ran == []


class Target:
    """A stand-in leader LLM: `generate` returns its prompt reversed (a prompt "fail" raises),
    `stream` yields a one-token block every 10 ms for `blocks` blocks (raising at block
    `fail_at`)."""

    def __init__(self):
        self.closed = threading.Event()
        self.stream_left = threading.Event()
        self.blocks_made = 0

    def generate(self, prompt, max_new_tokens=None, **options):
        if prompt == "fail":
            raise NumericalError("non-finite logits at a position being decided")
        return prompt[::-1]

    def set_execution_mode(self, mode):
        return None

    def collective_rpc(self, fn, *args, **kwargs):
        return [fn(self, *args, **kwargs)]

    def stream(self, prompt, blocks=3, fail_at=None):
        try:
            for i in range(blocks):
                time.sleep(0.01)
                if i == fail_at:
                    raise NumericalError(f"block {i} failed")
                self.blocks_made += 1
                yield BlockOutput(i, [i], str(i), 1, [0], "length" if i == blocks - 1 else None)
        finally:
            self.stream_left.set()

    def close(self):
        self.closed.set()


def _linked(target):
    """Rank 0's RemoteGroup and the leader's loop (a thread) over a thread channel."""
    channel = ThreadChannel(2)
    remote = RemoteGroup(1, 1, Calls(channel.rank(0)))
    leader = threading.Thread(target=lead, args=(Calls(channel.rank(1)), target), daemon=True)
    leader.start()
    return remote, leader


def test_a_link_runs_calls_and_streams_on_the_leader_and_survives_their_failures():
    target = Target()
    remote, leader = _linked(target)
    assert remote.generate("abc") == "cba"
    with pytest.raises(NumericalError, match="non-finite"):  # the leader's own error
        remote.generate("fail")
    assert remote.submit(remote.call, "generate", "xy").result(10) == "yx"
    with pytest.raises(NumericalError, match="block 1 failed"):
        list(remote.stream("p", blocks=3, fail_at=1))
    blocks = list(remote.stream("p", blocks=3))
    assert [b.token_ids for b in blocks] == [[0], [1], [2]]
    assert blocks[-1].finish_reason == "length"
    # closing a stream after its first block stops the leader's stream at its next block
    target.stream_left.clear()
    made = target.blocks_made
    stream = remote.stream("p", blocks=1000)
    assert next(stream).token_ids == [0]
    stream.close()
    assert target.stream_left.wait(10) and target.blocks_made - made <= 2
    assert remote.generate("ok") == "ko"  # still in step
    assert remote.lost is None
    remote.close()
    leader.join(10)
    assert target.closed.is_set() and not leader.is_alive()
