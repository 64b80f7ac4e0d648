"""Run under torchrun by `tests/e2e/test_ranks_torchrun.py`: faults on one rank, and closing.

    torchrun --nproc-per-node 2 tests/unit/tp_calls.py SCENARIO CKPT OUT.json

faults  rank 1's decoder raises, after computing it, instead of returning block 1 of a request
        whose prompt starts with 901 (block 0 for 902); rank 0's post-block processing raises
        at block 1 of the next request (block 0 of the one after). Rank 0 writes each faulty
        request's error, then the tokens of a healthy request after each fault and after a
        stream it closed after one block.
close   `with LLM(...)`; inside it, the ranks' all-reduce buffers are a host stand-in whose
        release each rank appends to EVENTS; rank 0 writes what a call after close raised and
        whether the process group is gone.
atexit  one request and no close: the LLM closes at exit.
load    rank 1's KV cache cannot be made (after the ranks agreed on the checkpoint and options):
        each rank writes what `LLM(...)` raised to OUT.json.rank<R> and exits 1 (rank 1 once
        rank 0 has written: torchrun stops the other ranks when one exits).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch.distributed as dist

from dlrt import LLM

RANK = int(os.environ.get("RANK", "0"))  # this script's own choice of fault per rank
REQUEST = dict(max_new_tokens=12, block_length=4, temperature=0.0)
HEALTHY = [5, 6, 7]


def break_follower_decoder() -> None:
    """Rank 1's decoder: a request whose prompt starts with 901 (902) raises once its block 1
    (block 0) is computed, instead of returning it."""
    from dlrt.runtime.block_decoder import BlockDecoder

    real = BlockDecoder.decode

    def decode(self, prompt, params):
        fail_at = {901: 1, 902: 0}.get(prompt[0])
        for k, block in enumerate(real(self, prompt, params)):
            if k == fail_at:
                raise RuntimeError(f"injected fault on rank {RANK} at block {k}")
            yield block

    BlockDecoder.decode = decode


def break_leader_trim(at: int) -> None:
    """Rank 0's post-block processing (`trim`) raises at block `at` of the next request."""
    import dlrt.llm

    real, calls = dlrt.llm.trim, [0]

    def trim(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at + 1:
            dlrt.llm.trim = real
            raise RuntimeError(f"injected fault on rank {RANK} at block {at}")
        return real(*args, **kwargs)

    dlrt.llm.trim = trim


def error_of(llm: LLM, prompt: list[int]) -> str:
    try:
        llm.generate(prompt, **REQUEST)
    except Exception as e:  # noqa: BLE001 - what the caller gets is the point
        return f"{type(e).__name__}: {e}"
    return "no error"


def faults(llm: LLM) -> dict:
    out = {"errors": [], "after": []}
    for prompt in ([901, 1, 2], [902, 1, 2]):
        out["errors"].append(error_of(llm, prompt))
        out["after"].append(llm.generate(HEALTHY, **REQUEST).token_ids)
    for at in (1, 0):
        break_leader_trim(at)
        out["errors"].append(error_of(llm, [9, 8, 7]))
        out["after"].append(llm.generate(HEALTHY, **REQUEST).token_ids)
    stream = llm.stream([9, 8, 7], **REQUEST)
    next(stream)
    stream.close()  # the consumer stops after one block: every rank stops
    out["after"].append(llm.generate(HEALTHY, **REQUEST).token_ids)
    return out


class FakeRuntime:
    """cudaIpcCloseMemHandle / cudaFree, each appended to the events file."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank

    def _note(self, what: str):
        with open(self.path, "a") as f:
            f.write(f"rank {self.rank} {what}\n")
        return (0,)

    def cudaIpcCloseMemHandle(self, ptr):  # noqa: N802 - the CUDA name
        return self._note(f"unmaps {ptr}")

    def cudaFree(self, ptr):  # noqa: N802
        return self._note(f"frees {ptr}")


def host_buffers(llm: LLM, path: str) -> None:
    """This rank's all-reduce: a P2PAllReduce holding fake buffers (its own, 100 + rank; the
    peers' it maps, 200 + peer) released through FakeRuntime over the control channel."""
    from dlrt.distributed import p2p

    tp = llm.engine.tp

    class HostBuffers(p2p.P2PAllReduce):
        def close(self):  # as P2PAllReduce.close, with no device to wait for
            if self._own is not None:
                self._release(self._barrier)

    ar = HostBuffers.__new__(HostBuffers)
    ar.group, ar.rank, ar.world = tp.control.group, tp.rank, tp.size
    ar._rt, ar._own = FakeRuntime(path, tp.rank), 100 + tp.rank
    ar._opened = [200 + r for r in range(tp.size) if r != tp.rank]
    tp.reducer = ar


def close(llm_args: tuple, out: str) -> dict:
    events = out + ".events"
    with LLM(*llm_args, dtype="float32") as llm:
        ids = llm.generate(HEALTHY, **REQUEST).token_ids
        llm.collective_rpc(host_buffers, events)
    after = error_of(llm, HEALTHY)
    llm.close()  # again: nothing
    return {"ids": ids, "after_close": after, "initialized": dist.is_initialized(),
            "events": open(events).read().splitlines()}


def load(ckpt: str, out: str) -> int:
    import time

    import dlrt.engine.engine

    if RANK == 1:
        def kv_cache(*args, **kwargs):
            raise RuntimeError(f"injected fault on rank {RANK} while loading")

        dlrt.engine.engine._kv_cache = kv_cache
    try:
        LLM(ckpt, dtype="float32")
    except Exception as e:  # noqa: BLE001 - what each rank raised is the point
        with open(f"{out}.rank{RANK}", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
    else:
        return 0
    for _ in range(300):
        if os.path.exists(f"{out}.rank0"):
            break
        time.sleep(0.1)
    return 1


def main(scenario: str, ckpt: str, out: str) -> int:
    logging.basicConfig(level=logging.INFO, format=f"[rank {RANK}] %(name)s: %(message)s")
    if scenario == "faults":
        if RANK == 1:
            break_follower_decoder()
        result = faults(LLM(ckpt, dtype="float32"))
    elif scenario == "close":
        result = close((ckpt,), out)
    elif scenario == "load":
        return load(ckpt, out)
    elif scenario == "atexit":
        llm = LLM(ckpt, dtype="float32")
        result = {"ids": llm.generate(HEALTHY, **REQUEST).token_ids}
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
