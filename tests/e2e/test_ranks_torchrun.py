"""Rank 0's calls under torchrun on the CPU (gloo, two ranks, `tests/unit/tp_calls.py`): a
fault on one rank ends the request on every rank, rank 0's caller gets an error naming the rank
that failed, the other rank logs it, and the next request gives one process's tokens; `close`
releases the all-reduce's buffers rank by rank before the process group goes, and every rank
exits 0 whether the LLM was closed, left by a `with` block or left open at exit; a rank that
fails to load makes every rank raise at once, naming it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_tensor_parallel_torchrun import ROOT, torchrun

from dlrt import LLM

pytestmark = pytest.mark.slow  # torchrun subprocesses

SCRIPT = ROOT / "tests" / "unit" / "tp_calls.py"
REQUEST = dict(max_new_tokens=12, block_length=4, temperature=0.0)


def run(tmp_path: Path, scenario: str, ckpt) -> tuple:
    out = tmp_path / f"{scenario}.json"
    proc = torchrun(2, str(SCRIPT), scenario, str(ckpt), str(out), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stderr


def test_a_fault_on_one_rank_ends_the_request_on_every_rank(tiny_sdar, tmp_path):
    out, log = run(tmp_path, "faults", tiny_sdar)
    follower = [f"RankError: rank 1 failed the request: RuntimeError: injected fault on rank 1 "
                f"at block {k}" for k in (1, 0)]
    leader = [f"RuntimeError: injected fault on rank 0 at block {k}" for k in (1, 0)]
    assert out["errors"] == follower + leader
    # every rank reports it: rank 1 its own fault, and rank 0's
    assert log.count("[rank 1] dlrt.distributed.calls: rank 1: _follow_request failed") == 2
    for k in (1, 0):
        assert f"[rank 1] dlrt.distributed.calls: rank 1: rank 0 failed the request: " \
               f"RuntimeError: injected fault on rank 0 at block {k}" in log
    # the ranks stay in step: each next request gives one process's tokens
    want = LLM(tiny_sdar, dtype="float32").generate([5, 6, 7], **REQUEST).token_ids
    assert len(want) == 12
    assert out["after"] == [want] * 5


def test_close_releases_in_rank_order_and_every_rank_exits_0(tiny_sdar, tmp_path):
    out, log = run(tmp_path, "close", tiny_sdar)
    assert len(out["ids"]) == 12
    assert out["after_close"] == "DlrtError: this LLM is closed"
    assert out["initialized"] is False  # the process group is gone
    # rank by rank: the peers' buffers unmapped, then each rank's own freed
    assert out["events"] == ["rank 0 unmaps 201", "rank 1 unmaps 200",
                             "rank 0 frees 100", "rank 1 frees 101"]
    assert "[rank 1] dlrt.llm: rank 1 closed with rank 0" in log


def test_an_llm_left_open_closes_at_exit(tiny_sdar, tmp_path):
    out, log = run(tmp_path, "atexit", tiny_sdar)
    assert len(out["ids"]) == 12
    assert "[rank 1] dlrt.llm: rank 1 closed with rank 0" in log


def test_a_rank_that_fails_to_load_makes_every_rank_raise_naming_it(tiny_sdar, tmp_path):
    """Rank 1 fails after the ranks agreed (its KV cache): rank 0 does not wait for it on the
    control channel; both raise at the end of the load, rank 0 naming rank 1 and its error."""
    out = tmp_path / "load.json"
    start = time.monotonic()
    proc = torchrun(2, str(SCRIPT), "load", str(tiny_sdar), str(out), tmp=tmp_path,
                    timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - start < 90, "a rank waited for the other"
    err = {r: Path(f"{out}.rank{r}").read_text() for r in (0, 1)}
    assert err[1] == "RuntimeError: injected fault on rank 1 while loading", proc.stderr[-3000:]
    assert err[0] == ("RankError: rank 0: rank 1 failed to load the model: RuntimeError: "
                      "injected fault on rank 1 while loading"), proc.stderr[-3000:]
