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


def test_not_slow_is_a_fast_loop_that_skips_the_subprocess_suites():
    """`pytest -m "not slow"` leaves out the end-to-end files that start subprocesses, and
    never turns on the tests that write gigabytes (marked `huge`)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", "not slow", str(TESTS / "e2e"),
                           str(TESTS / "unit" / "test_checkpoint.py")],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    kept = {line.split("::")[0].rsplit("/", 1)[-1] for line in proc.stdout.splitlines()
            if "::" in line}
    assert "test_server_startup.py" not in kept and "test_examples.py" not in kept
    assert "test_server.py" in kept and "test_checkpoint.py" in kept
    huge = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not slow", "-k", "test_reduced_copy_of_real",
                           str(TESTS / "unit" / "test_checkpoint.py")],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert "2 skipped" in huge.stdout and "passed" not in huge.stdout, huge.stdout[-2000:]
