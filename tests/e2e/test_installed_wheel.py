"""The device loop from an installed wheel, not the checkout (GPU, marked `gpu`).

The wheel is built from this tree and installed into a temporary folder; a subprocess started
outside the checkout imports dlrt from there, builds the WHILE node's condition kernel from the
CUDA source the wheel ships (a fresh cache folder: nothing built before), and decodes in the
device loop the tokens eager execution decodes. The CPU side of the same path runs in CI
(`.ci/wheel.sh`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from pathlib import Path
import dlrt
from dlrt import LLM
from dlrt.resources import csrc_path
site = Path(sys.argv[1]).resolve()
assert site in Path(dlrt.__file__).resolve().parents, dlrt.__file__
assert site in csrc_path("graph_cond.cu").resolve().parents, csrc_path("graph_cond.cu")
llm = LLM(sys.argv[2], device="cuda", max_model_len=512)
assert llm.execution_mode == "device_loop"
opts = dict(max_new_tokens=16, temperature=0, ignore_eos=True)
loop = llm.generate(list(range(100, 111)), **opts).token_ids
built = sorted(p.name for p in (Path(sys.argv[3]) / "kernels").glob("graph_cond-*.cubin"))
llm.set_execution_mode("eager")
eager = llm.generate(list(range(100, 111)), **opts).token_ids
print(json.dumps(dict(loop=loop, eager=eager, built=built, captures=llm.executor.captures)))
"""


def test_device_loop_from_the_installed_wheel(tiny_sdar, tmp_path):
    dist, site, cache = tmp_path / "dist", tmp_path / "site", tmp_path / "cache"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("dlrt-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                              "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), PYTHONSAFEPATH="1", DLRT_CACHE_DIR=str(cache))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(site), str(tiny_sdar), str(cache)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["built"] and out["captures"] >= 1  # the kernel built from the wheel's source
    assert out["loop"] == out["eager"] and len(out["loop"]) == 16
