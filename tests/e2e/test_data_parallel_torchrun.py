"""Data parallelism under torchrun on the CPU (gloo, eager, fp32). Two groups of two
tensor-parallel ranks: `generate` with a list of prompts gives every prompt the tokens of one
process, in order, each prompt run once (by the group its share names), and inside
`collective_rpc` every rank returns the whole list. Two groups of one rank: `bench humaneval`
shares its prompts (each answered once, with one process's tokens, in order) and reports each
group's throughput and the total."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tensor_parallel_torchrun import ROOT, torchrun

from dlrt import LLM
from dlrt.bench.humaneval import load_prompts
from dlrt.distributed.data_parallel import share_by_cost

pytestmark = pytest.mark.slow  # torchrun subprocesses

WORKER = ROOT / "tests" / "unit" / "dp_generate.py"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], list(range(20, 33)), [3], [4, 4, 4, 4]]
JOBS = [{"prompts": PROMPTS, "options": {"max_new_tokens": 8, "temperature": 0.0}},
        {"prompts": PROMPTS[:3], "options": {"max_new_tokens": 8, "temperature": 0.7,
                                             "seed": 3}}]


def test_two_groups_of_two_ranks_answer_every_prompt_once_as_one_process(tiny_sdar, tmp_path):
    n, dp = 4, 2
    llm = LLM(tiny_sdar, dtype="float32")
    jobs, out = tmp_path / "jobs.json", tmp_path / "out.json"
    jobs.write_text(json.dumps(JOBS))
    proc = torchrun(n, str(WORKER), str(tiny_sdar), str(out), str(jobs),
                    json.dumps({"data_parallel_size": dp}), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert (got["world"], got["dp"], got["tp"]) == (n, dp, n // dp)
    for job, done in zip(JOBS, got["jobs"], strict=True):
        want = [r.token_ids for r in llm.generate(job["prompts"], **job["options"])]
        assert done["leader"] == want
        assert all(ranks == want for ranks in done["ranks"])  # every rank: the whole list
        new = job["options"]["max_new_tokens"]
        shares = share_by_cost([len(p) + new for p in job["prompts"]], dp)
        assert done["shares"] == shares and all(shares)
        # each prompt ran once, on its group (every rank of a group runs its requests)
        assert done["ran"] == [len(shares[r // (n // dp)]) for r in range(n)]


def test_bench_humaneval_shares_the_prompts_among_two_groups(tmp_path):
    args = ("-m", "dlrt", "bench", "humaneval", "--num-prompts", "3", "--max-new-tokens", "8",
            "--data-parallel-size", "2", "--out", str(tmp_path / "runs"), "--quiet")
    proc = torchrun(2, *args, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(next(Path(tmp_path / "runs").glob("humaneval-*.json")).read_text())
    assert record["data_parallel_size"] == 2
    (mode, shared), = record["data_parallel"].items()
    rows, groups, total = record["modes"][mode]["rows"], shared["groups"], shared["total"]
    problems = load_prompts(None, 3)
    llm = LLM()
    assert [r["task"] for r in rows] == [p["task_id"] for p in problems]  # in order
    assert [r["token_ids"] for r in rows] == \
        [llm.generate(p["prompt"], max_new_tokens=8).token_ids for p in problems]
    assert [g["group"] for g in groups] == [0, 1] and all(g["requests"] for g in groups)
    assert sorted(t for g in groups for t in g["tasks"]) == sorted(r["task"] for r in rows)
    assert total["requests"] == 3
    assert total["new_tokens"] == sum(g["new_tokens"] for g in groups)
    assert total["tps"] == pytest.approx(total["new_tokens"] / max(g["wall_s"] for g in groups))
    assert all(g["tps"] == pytest.approx(g["new_tokens"] / g["wall_s"]) for g in groups)
    assert "total" in proc.stdout
