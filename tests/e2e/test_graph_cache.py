"""Captured graphs are keyed on kinds, not request values, and the graph cache is bounded and
frees what it drops (GPU, marked `gpu`).

50 requests with 50 distinct temperatures and thresholds capture a small constant number of
graphs, the GPU memory in use after the 50th is within 64 MiB of after the second, and every
request's tokens equal eager execution's. Cycling through more kinds than the cache holds keeps
at most `MAX_GRAPHS` graph sets, and a second cycle leaves the memory where the first left it.
"""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.runtime.executor import MAX_GRAPHS

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def used_bytes() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


@pytest.fixture(scope="module")
def llm(tiny_sdar):
    return LLM(tiny_sdar, device="cuda", max_model_len=1024)


@pytest.mark.parametrize("mode", ["device_loop", "host_loop"])
def test_fifty_values_capture_a_constant_number_of_graphs(llm, mode):
    prompt = list(range(300, 317))
    used, captures, outs = {}, {}, {}
    start = llm.executor.captures
    for i in range(50):
        opts = dict(max_new_tokens=12, temperature=0.5 + i / 25, threshold=0.05 + i / 60,
                    top_k=40 + i, top_p=0.8 + i / 500, seed=3, ignore_eos=True)
        llm.set_execution_mode(mode)
        outs[i] = llm.generate(prompt, **opts).token_ids
        captures[i], used[i] = llm.executor.captures, used_bytes()
        if i % 7 == 0:
            llm.set_execution_mode("eager")
            assert llm.generate(prompt, **opts).token_ids == outs[i], i
    assert captures[49] == captures[0] <= start + 2  # first and later blocks of one kind
    assert used[49] - used[1] <= 64 * MiB, (used[1], used[49])
    assert len({tuple(o) for o in outs.values()}) > 1  # the values reach the draw


def test_graph_cache_is_bounded_and_frees_what_it_drops(llm):
    llm.set_execution_mode("device_loop")
    lengths = list(range(1, MAX_GRAPHS + 5))  # a kind (program) per block length

    def cycle():
        for b in lengths:
            llm.generate([5, 6, 7], max_new_tokens=2 * b, block_length=b, temperature=0)
        return used_bytes()

    first = cycle()
    assert llm.executor.graph_count <= MAX_GRAPHS
    second = cycle()
    assert llm.executor.graph_count <= MAX_GRAPHS
    assert second - first <= 64 * MiB, (first, second)
