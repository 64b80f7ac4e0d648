"""Tensor parallelism under torchrun on the CPU (gloo, eager, fp32): two ranks generate the
same tokens as one process for SDAR dense, SDAR-MoE, LLaDA and LLaDA2 with greedy, threshold
and sampled requests (rank 0's, which every rank runs with it, and every rank's own through
`collective_rpc`); ranks that disagree on the checkpoint or a size that does not split the
model stop before any weight loads, naming the problem; the CLI runs cut across ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dlrt import LLM

pytestmark = pytest.mark.slow  # torchrun subprocesses

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "unit" / "tp_generate.py"
REQUESTS = [
    {"prompt": [1, 2, 3, 4, 5, 6, 7], "max_new_tokens": 12, "temperature": 0.0},
    {"prompt": [9, 8, 7], "max_new_tokens": 8, "temperature": 0.0,
     "remasking_strategy": "threshold", "threshold": 0.5},
    {"prompt": [9, 8, 7], "max_new_tokens": 8, "temperature": 0.7, "seed": 3},
]


def torchrun(n: int, *argv: str, tmp: Path, timeout: float = 240
             ) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node n argv` with `tmp` as its temp dir (TMPDIR), where torchrun
    leaves its `torchelastic_*` log folder: the test's temp folder, not the system's."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(n), *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_worker(tmp_path: Path, n: int, ckpt: str, requests=REQUESTS, options=None):
    req, out = tmp_path / "requests.json", tmp_path / "out.json"
    req.write_text(json.dumps(requests))
    proc = torchrun(n, str(WORKER), ckpt, str(out), str(req), json.dumps(options or {}),
                    tmp=tmp_path)
    return proc, (json.loads(out.read_text()) if proc.returncode == 0 else None)


@pytest.mark.parametrize("preset", ["tiny_sdar", "tiny_sdar_moe", "tiny_llada", "tiny_llada2"])
def test_two_ranks_generate_the_tokens_of_one(preset, request, tmp_path):
    ckpt = request.getfixturevalue(preset)
    llm = LLM(ckpt, dtype="float32")
    want = [llm.generate(r["prompt"], **{k: v for k, v in r.items() if k != "prompt"}).token_ids
            for r in REQUESTS]
    proc, out = run_worker(tmp_path, 2, str(ckpt))
    assert out is not None, proc.stderr[-3000:]
    assert out["world"] == 2 and out["tp"] == 2
    # rank 0's requests (run by every rank with it), and every rank's through collective_rpc
    assert out["leader"] == out["ranks"][0] == out["ranks"][1] == want
    assert all(len(ids) > 0 for ids in want)


def test_unseeded_sampling_draws_the_same_tokens_on_every_rank(tiny_sdar, tmp_path):
    """No seed given: rank 0 chooses it for every rank (else the ranks would commit different
    tokens, or stop after different rounds and wait on each other)."""
    requests = [{"prompt": [9, 8, 7], "max_new_tokens": 12, "temperature": 1.0},
                {"prompt": [9, 8, 7], "max_new_tokens": 12, "temperature": 0.0,
                 "remasking_strategy": "random"}]
    proc, out = run_worker(tmp_path, 2, str(tiny_sdar), requests)
    assert out is not None, proc.stderr[-3000:]
    assert out["ranks"][0] == out["ranks"][1]


def test_ranks_that_disagree_on_the_checkpoint_stop(tiny_sdar, tiny_llada, tmp_path):
    proc, _ = run_worker(tmp_path, 2, f"{tiny_sdar},{tiny_llada}")
    assert proc.returncode != 0
    assert "disagree on the checkpoint" in proc.stderr, proc.stderr[-3000:]
    # one config, other weights
    from dlrt.checkpoint.make import make_checkpoint

    other = make_checkpoint("tiny-sdar", tmp_path / "seed7", seed=7, dtype="float32")
    proc, _ = run_worker(tmp_path, 2, f"{tiny_sdar},{other}")
    assert proc.returncode != 0
    assert "disagree on the checkpoint" in proc.stderr, proc.stderr[-3000:]


def test_ranks_that_disagree_on_an_option_stop(tiny_sdar, tmp_path):
    proc, _ = run_worker(tmp_path, 2, str(tiny_sdar),
                         options={"_per_rank": [{"dtype": "float32"}, {"dtype": "bfloat16"}]})
    assert proc.returncode != 0
    assert "disagree on dtype (rank 0: 'float32', rank 1: 'bfloat16')" in proc.stderr, \
        proc.stderr[-3000:]


def test_torchrun_leaves_no_folder_in_the_system_temp_dir(tiny_sdar, tmp_path):
    """torchrun writes a `torchelastic_*` folder into its temp dir and never removes it: the
    suite's runs give it the test's temp folder."""
    system = Path(tempfile.gettempdir())
    before = set(system.glob("torchelastic_*"))
    proc, _ = run_worker(tmp_path, 3, str(tiny_sdar))  # stops before any weight loads
    assert proc.returncode != 0
    assert set(system.glob("torchelastic_*")) - before == set()
    assert list(tmp_path.glob("torchelastic_*"))  # here instead, removed with tmp_path


def test_a_size_that_does_not_split_the_model_is_named(tiny_sdar, tmp_path):
    proc, _ = run_worker(tmp_path, 3, str(tiny_sdar))
    assert proc.returncode != 0
    assert "tensor_parallel_size 3 does not divide num_attention_heads 4" in proc.stderr, \
        proc.stderr[-3000:]


def test_cli_generate_cut_across_two_ranks(tiny_sdar, tmp_path):
    args = ("-m", "dlrt", "generate", "--model", str(tiny_sdar), "--prompt-ids", "5,6,7",
            "--max-new-tokens", "8", "--json", "--quiet")
    proc = torchrun(2, *args, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = subprocess.run([sys.executable, *args, "--tensor-parallel-size", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1  # rank 0 prints; rank 1 ran the request with it
    assert printed[0]["token_ids"] == json.loads(one.stdout)["token_ids"]
