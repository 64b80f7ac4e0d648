"""Weight updates, sleep and wake under torchrun on the CPU (gloo, two ranks, tensor parallel):
an update equals a fresh engine of the new checkpoint (one process), whether rank 0's tensors
(each rank takes its slices) or a folder; a tensor of the wrong shape is refused on every rank
and changes nothing; every rank sleeps and wakes with rank 0, and the tokens after a wake
equal those before (`tests/unit/tp_weights.py` runs the ranks). With two data-parallel groups of
one rank each, the same reach both groups: each group's tokens follow every update, sleep and
wake, and both ranks sleep and wake."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_tensor_parallel_torchrun import ROOT, torchrun

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint

pytestmark = pytest.mark.slow  # torchrun subprocesses

WORKER = ROOT / "tests" / "unit" / "tp_weights.py"
PROMPT = [5, 6, 7, 8, 9, 10]
REQUEST = dict(max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True)


def _weights_only(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        os.symlink(src / name, dst / name)
    return dst


@pytest.mark.parametrize("preset,options", [
    ("tiny-sdar-moe", {}), ("tiny-llada2", {}), ("tiny-sdar-moe", {"data_parallel_size": 2})])
def test_two_ranks_update_sleep_and_wake(preset, options, tmp_path):
    a, b = (_weights_only(make_checkpoint(preset, tmp_path / f"full{s}", seed=s,
                                          dtype="float32"), tmp_path / f"seed{s}")
            for s in (0, 1))
    want_a, want_b = (LLM(p, dtype="float32").generate(PROMPT, **REQUEST).token_ids
                      for p in (a, b))
    assert want_a != want_b
    out = tmp_path / "out.json"
    proc = torchrun(2, str(WORKER), str(a), str(b), str(out), json.dumps(options),
                    tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    dp = options.get("data_parallel_size", 1)
    assert (got["tp"], got["dp"]) == (2 // dp, dp)
    want_a, want_b = [want_a] * dp, [want_b] * dp  # every group's tokens
    assert got["a"] == got["a_folder"] == got["after_error"] == want_a
    assert got["a_wake"] == got["a_sleep2"] == want_a
    assert got["b_mapping"] == got["b_sleep2"] == want_b
    assert got["shape_error"].startswith("WeightsError") and "shape" in got["shape_error"]
    assert "nothing was updated" in got["shape_error"]
    assert got["asleep_error"].startswith("AsleepError")
    events = (tmp_path / "out.json.events").read_text().splitlines()
    for rank in (0, 1):
        mine = [e.split(" ", 2)[2] for e in events if e.startswith(f"rank {rank} ")]
        assert [e.split(" kv ")[0] for e in mine] == ["sleep 1", "wake", "sleep 2", "wake",
                                                      "sleep 2", "wake"], mine
        assert all(e.endswith(" kv 0") for e in mine if e.startswith("sleep"))
        assert all(not e.endswith(" kv 0") for e in mine if e.startswith("wake"))
