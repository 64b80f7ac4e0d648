"""Ctrl-C (SIGINT) on a busy `dlrt` command, as a user sends it: every command ends with one
line on stderr, "interrupted", and exit status 130, never a traceback. The commands run as
subprocesses; each gets its SIGINT once it is seen at work (generating, writing a checkpoint,
loading a model, benchmarking)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import free_port

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples

PY_M = [sys.executable, "-m", "dlrt"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
# `dlrt ...` whose model load takes until it is interrupted: LLM(...) says "loading" on stdout
SLOW_LOAD = """
import sys, time
import dlrt.llm

def load(self, *args, **kwargs):
    print("loading", flush=True)
    time.sleep(600)

dlrt.llm.LLM.__init__ = load
from dlrt.entrypoints.cli import main
sys.exit(main())
"""

# `dlrt ...` interrupted inside code made by exec of a string, as a dataclass's methods are
# made while torch imports its parts lazily during a load
INTERRUPTED_IN_EXEC = """
import sys
import dlrt.llm

def load(self, *args, **kwargs):
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass")

dlrt.llm.LLM.__init__ = load
from dlrt.entrypoints.cli import main
sys.exit(main())
"""


def interrupt(argv: list[str], busy: Callable[[subprocess.Popen], bool], cwd: Path,
              timeout: float = 120.0) -> tuple[int, str]:
    """Start `argv`, send SIGINT once `busy(proc)` holds; the exit status and stderr."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while not busy(proc):
            assert proc.poll() is None, f"ended before it was busy:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "never busy"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode("utf-8", errors="replace")


def first_stdout(proc: subprocess.Popen) -> bool:
    """Something was written on stdout (read one byte: the rest is left in the pipe)."""
    return bool(os.read(proc.stdout.fileno(), 1))


def mapped(library: str, after_s: float = 1.0) -> Callable[[subprocess.Popen], bool]:
    """Busy `after_s` seconds after `library` is mapped into the process."""
    seen: list[float] = []

    def busy(proc: subprocess.Popen) -> bool:
        if not seen and library in Path(f"/proc/{proc.pid}/maps").read_text():
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > after_s
    return busy


def one_line(rc: int, err: str) -> None:
    assert rc == 130, err
    assert err == "interrupted\n", err


def test_generate(tiny_sdar, tmp_path):
    rc, err = interrupt(PY_M + ["generate", "--model", str(tiny_sdar), "--dtype", "float32",
                                "--prompt", "hello", "--max-new-tokens", "4000",
                                "--ignore-eos", "--temperature", "0"], first_stdout, tmp_path)
    one_line(rc, err)


def test_make_checkpoint(tmp_path):
    """Interrupted while it draws and writes the weights: its temporary folder is gone."""
    out = tmp_path / "made" / "sdar"
    out.parent.mkdir()
    rc, err = interrupt(PY_M + ["make-checkpoint", "SDAR-1.7B-Chat", str(out),
                                "--num-layers", "1"],
                        lambda _: any(out.parent.glob(".tmp-*")), tmp_path)
    one_line(rc, err)
    assert list(out.parent.iterdir()) == []


def test_serve_while_loading(tiny_sdar, tmp_path):
    rc, err = interrupt([sys.executable, "-c", SLOW_LOAD, "serve", "--model", str(tiny_sdar),
                         "--port", str(free_port())], first_stdout, tmp_path)
    one_line(rc, err)


def test_bench_humaneval(tiny_sdar, tmp_path):
    """Interrupted while it generates (seconds after the tokenizer library is loaded: past
    the model load, where torch imports triton, whose native start aborts on an interrupt)."""
    rc, err = interrupt(PY_M + ["bench", "humaneval", "--model", str(tiny_sdar),
                                "--dtype", "float32", "--num-prompts", "8",
                                "--max-new-tokens", "512", "--ignore-eos",
                                "--out", str(tmp_path / "runs")],
                        mapped("tokenizers", after_s=3.0), tmp_path)
    one_line(rc, err)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return out


def test_bench_serve_stops_its_server(tiny_sdar, tmp_path):
    """Interrupted in its HTTP part: its `dlrt serve` stops too, and no log path is shown."""
    servers: list[int] = []
    seen: list[float] = []

    def busy(proc: subprocess.Popen) -> bool:
        if not servers:
            servers.extend(children(proc.pid))
            seen.append(time.monotonic())
        return bool(servers) and time.monotonic() - seen[0] > 2

    rc, err = interrupt(PY_M + ["bench", "serve", "--model", str(tiny_sdar),
                                "--dtype", "float32", "--num-prompts", "1",
                                "--max-new-tokens", "64", "--out", str(tmp_path / "runs")],
                        busy, tmp_path)
    one_line(rc, err)
    for pid in servers:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", pid


def test_interrupted_inside_exec_code(tiny_sdar, tmp_path):
    """The interpreter, marked to end by SIGINT, still exits with 130 (run with -m, as
    `python -m dlrt`: the mark decides the status of a module run so)."""
    (tmp_path / "interrupted_in_exec.py").write_text(INTERRUPTED_IN_EXEC)
    out = subprocess.run([sys.executable, "-m", "interrupted_in_exec", "generate", "--model",
                          str(tiny_sdar), "--prompt", "hello"], capture_output=True, text=True,
                         env=ENV, cwd=tmp_path, timeout=120)
    one_line(out.returncode, out.stderr)
