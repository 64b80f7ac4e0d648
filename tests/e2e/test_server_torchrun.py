"""`dlrt serve` under torchrun with two CPU ranks: rank 0 serves HTTP, rank 1 follows block for
block (gloo control channel); answers equal `LLM` in this process, and SIGTERM to the launcher
takes every process down."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from dlrt import LLM

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "-m")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def rank_of(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    rank = [e[5:] for e in env if e.startswith(b"RANK=")]
    return int(rank[0]) if rank else None


def generate(url: str, body: dict) -> list[dict]:
    with httpx.Client(timeout=60) as c, c.stream("POST", url + "/generate", json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


@pytest.fixture(scope="module")
def llm(tiny_sdar) -> LLM:
    return LLM(tiny_sdar, dtype="float32")


def test_two_ranks_answer_like_one_process(start_server, llm):
    server = start_server("torchrun", launcher=TORCHRUN)
    server.wait_log("rank 1 following rank 0")
    assert "(2 rank(s))" in server.log()
    ranks = {rank_of(p): p for p in server.descendants() if rank_of(p) is not None}
    assert sorted(ranks) == [0, 1], ranks

    for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 7}):
        ref = llm.generate("The capital of France is", max_new_tokens=24, **sampling)
        rows = generate(server.url, {"prompt": "The capital of France is",
                                     "max_new_tokens": 24, **sampling})
        assert [t for b in rows[:-1] for t in b["token_ids"]] == ref.token_ids
        assert "".join(b["text"] for b in rows[:-1]) == ref.text
        assert rows[-1]["finish_reason"] == ref.finish_reason

    # rank 1 runs every block of a request too (it idles in a blocking receive otherwise)
    before = {r: cpu_s(p) for r, p in ranks.items()}
    rows = generate(server.url, {"prompt": "follow me", "max_new_tokens": 64,
                                 "ignore_eos": True, "temperature": 0})
    assert rows[-1]["completion_tokens"] == 64
    used = {r: cpu_s(p) - before[r] for r, p in ranks.items()}
    assert used[1] >= 0.5 * used[0], used

    # SIGTERM to the launcher stops both ranks and the launcher
    os.kill(server.pid, signal.SIGTERM)
    server.proc.wait(30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in ranks.values()):
        assert time.monotonic() < deadline, f"ranks still running: {ranks}"
        time.sleep(0.1)


def _nan_row_copy(src: Path, dst: Path, token: int) -> Path:
    """A copy of a checkpoint whose embedding row `token` is NaN (its logits are not finite)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        if "model.embed_tokens.weight" in tensors:
            tensors["model.embed_tokens.weight"][token] = float("nan")
            save_file(tensors, f, metadata={"format": "pt"})
    return dst


def test_a_failed_request_leaves_every_rank_serving(start_server, tiny_sdar, tmp_path):
    """A request whose logits are NaN fails on both ranks at the same block: rank 0 answers
    it with an error, rank 1 keeps following, and the next request is answered."""
    nan = _nan_row_copy(Path(tiny_sdar), tmp_path / "nan", token=7)
    server = start_server("torchrun-nan", "--model", str(nan), launcher=TORCHRUN)
    server.wait_log("rank 1 following rank 0")
    with httpx.Client(timeout=60) as c:
        bad = c.post(server.url + "/v1/completions",
                     json={"prompt": [7, 7, 7], "max_tokens": 8, "temperature": 0})
        assert bad.status_code >= 500, bad.text
        assert "non-finite" in bad.text
    rows = generate(server.url, {"input_ids": [1, 2, 3], "max_new_tokens": 8,
                                 "temperature": 0})
    assert rows[-1]["completion_tokens"] == 8
    ranks = [p for p in server.descendants() if rank_of(p) is not None]
    assert len(ranks) == 2 and all(alive(p) for p in ranks)
