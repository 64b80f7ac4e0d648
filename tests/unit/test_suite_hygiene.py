"""The test suite cleans up after itself: the embedded-default cache folder `tests/conftest.py`
makes is removed when the session ends, and passing tests' temp folders are not kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_tmp_path_retention(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
    assert int(pytestconfig.getini("tmp_path_retention_count")) <= 1


def test_the_cache_folder_is_removed(tmp_path):
    """An inner session with the suite's conftest: the cache folder it made is gone after it."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    record = tmp_path / "cache-path.txt"
    (tmp_path / "test_inner.py").write_text(
        "import os\n\n\ndef test_cache():\n"
        "    path = os.environ['DLRT_CACHE_DIR']\n"
        "    assert os.path.isdir(path)\n"
        f"    open({str(record)!r}, 'w').write(path)\n")
    env = {k: v for k, v in os.environ.items() if k != "DLRT_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    made = Path(record.read_text())
    assert made.name.startswith("dlrt-test-cache-") and not made.exists()
