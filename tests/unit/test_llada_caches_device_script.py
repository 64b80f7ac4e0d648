"""`benchmarks/device/llada_caches.sh` on the CPU: bash parses it, and it runs end to end on the
tiny LLaDA and LLaDA-MoE presets (dummy weights, eager, `-- --device cpu`, the models named by
$LLADA_MODELS) from a plain layout like the device machine's (`benchmarks/` and
`.devtools/models/`): one bench step record per model and run (smoothing over the dual cache
too), and the final table with its target lines."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "llada_caches.sh"


def test_bash_parses_it():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
def test_it_runs_on_the_cpu_with_the_tiny_presets(tiny_llada, tmp_path_factory, tmp_path):
    from dlrt.checkpoint.make import make_checkpoint

    tree = tmp_path / "tree"
    models = tree / ".devtools" / "models"
    models.mkdir(parents=True)
    (tree / "benchmarks").symlink_to(ROOT / "benchmarks")
    (tree / ".devtools" / "device-env.sh").write_text("")
    shutil.copytree(tiny_llada, models / "tiny-llada")
    make_checkpoint("tiny-llada-moe", models / "tiny-llada-moe", dtype="float32")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(ROOT),
           "LLADA_MODELS": "tiny-llada tiny-llada-moe"}
    run = subprocess.run(
        ["bash", "benchmarks/device/llada_caches.sh", "--prompts", "20", "--max-new-tokens",
         "16", "--block-length", "8", "--vicinity", "2", "--rounds", "2", "--", "--device",
         "cpu"], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    runs = {"dual": ["exact", "refresh", "window"], "prefix": ["exact", "refresh", "window"],
            "dual-vicinity": ["exact", "refresh", "window"],
            "smoothing": ["exact", "exact", "refresh", "window"]}
    for model in ("tiny-llada", "tiny-llada-moe"):
        for name, rounds in runs.items():
            (path,) = (out / "step" / model / name).glob(f"step-{model}-*.json")
            rec = json.loads(path.read_text())
            assert [r["round"] for r in rec["rows"]] == rounds
            assert [r["smoothing"] for r in rec["rows"]][1:] == [name == "smoothing"] * \
                (len(rounds) - 1)
            assert rec["dtype"] == "torch.bfloat16" and rec["summary"]["timed"] == "eager"
            assert rec["options"]["remasking_strategy"] == "threshold"
            if name == "dual-vicinity":
                assert rec["rows"][-1]["vicinity"] == "2/2"
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "prompt",
                                                                          "run"])
    table = [line.split() for line in lines[header + 1:header + 9]]
    runs = ["dual", "dual-vicinity", "prefix", "smoothing"]
    assert [row[:3] for row in table] == [[m, "20", r] for m in ("tiny-llada", "tiny-llada-moe")
                                          for r in runs]
    assert [row[8] for row in table] == (["window"] * 3 + ["window/smoothed"]) * 2
    targets = [line for line in lines if "the dual window round is" in line]
    assert [t.split(":")[0] for t in targets] == ["tiny-llada prompt 20",
                                                  "tiny-llada-moe prompt 20"]
