"""`benchmarks/device/gsm8k_harness.sh` on the CPU: bash parses it, and it runs GSM8K through the
harness end to end on the tiny SDAR preset (dummy weights, `--device cpu`, two problems) from a
plain layout like the device machine's (`benchmarks/`, `.devtools/models/`, `.devtools/data/`):
the harness's record and the summary of time and tok/s."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "gsm8k_harness.sh"
PROBLEMS = [{"question": f"Tom has {n} apples and eats 2. How many are left?",
             "answer": f"{n} - 2 = <<{n}-2={n - 2}>>{n - 2}\n#### {n - 2}"} for n in (5, 9, 12)]


def test_bash_parses_it():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
def test_it_runs_on_the_cpu_with_the_tiny_preset(tiny_sdar, tmp_path):
    tree = tmp_path / "tree"
    (tree / ".devtools" / "data").mkdir(parents=True)
    (tree / "benchmarks").symlink_to(ROOT / "benchmarks")
    (tree / ".devtools" / "device-env.sh").write_text("")
    (tree / ".devtools" / "data" / "gsm8k_test.jsonl").write_text(
        "".join(json.dumps(p) + "\n" for p in PROBLEMS))
    shutil.copytree(tiny_sdar, tree / ".devtools" / "models" / "tiny")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        ["bash", "benchmarks/device/gsm8k_harness.sh", "--limit", "2", "--fewshot", "1",
         "--max-gen-toks", "8", "--device", "cpu", "tiny", "--", "block_length=4"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    (record,) = (out / "gsm8k").glob("*/results_*.json")
    rec = json.loads(record.read_text())
    gen = rec["config"]["dlrt"]["generate_until"]
    assert gen["requests"] == 2 and gen["new_tokens"] <= 16 and gen["tokens_per_s"] > 0
    assert rec["config"]["dlrt"]["decoding"] == {"ignore_eos": True, "block_length": 4}
    assert rec["n-samples"]["gsm8k_local"]["effective"] == 2
    lines = run.stdout.splitlines()
    assert lines[0] == "== gsm8k tiny 2 problems, 1-shot, 8 new tokens, cpu"
    assert any(line.startswith("problems   2  (exact_match ") for line in lines)
    assert any(line.startswith("generate   ") and "tok/s" in line for line in lines)
