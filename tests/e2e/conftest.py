"""Real `dlrt serve` processes for the server tests: started on a free port, ready once /health
answers, stopped (their whole process group) at teardown. A failing test gets the log tail of
every live server attached to its report."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

_LIVE: list[Server] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess in its own session; stdout and stderr go to a log file."""

    def __init__(self, argv: list[str], port: int, name: str, log: Path,
                 tmp: Path | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.name = name
        self._log = log
        # NOTE: one OpenMP thread per process: the test machine's cores are shared.
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8",
                   PYTHONUNBUFFERED="1")
        if tmp is not None:  # NOTE: torchrun leaves a torchelastic_* folder in its temp dir
            env["TMPDIR"] = str(tmp)
        with open(self._log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self._log.read_text(encoding="utf-8", errors="replace")

    def health(self) -> dict:
        r = httpx.get(self.url + "/health", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_ready(self, timeout: float = 120.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server {self.name} not ready after {timeout} s:\n{self.log()}")

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "") -> dict:
        """Poll /health until `predicate(health)` holds; the last health."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if predicate(h):
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"{what or 'condition'} not reached in {timeout} s: {h}")
            time.sleep(0.02)

    def wait_log(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in the log of {self.name} after "
                                     f"{timeout} s:\n{self.log()}")
            time.sleep(0.05)
        return self.log()

    def descendants(self) -> list[int]:
        """Pids of the processes under the server (torchrun's ranks have their own sessions)."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(stat.parent.name))
        out, todo = [], [self.pid]
        while todo:
            kids = children.get(todo.pop(), [])
            out += kids
            todo += kids
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the process group, wait, then kill it and its descendants; the exit code."""
        family = self.descendants()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # what is left of the group
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        if self in _LIVE:
            _LIVE.remove(self)
        return self.proc.returncode


@pytest.fixture(scope="module")
def start_server(tmp_path_factory, tiny_sdar):
    """Factory: start_server(name, *flags, launcher=...) -> a ready `Server` running
    `<launcher> dlrt serve --model <tiny_sdar> --dtype float32 --port <free port> <flags>`;
    the launcher defaults to `python -m`; its temp dir (TMPDIR) is a pytest temp folder. All
    are stopped at module end."""
    started: list[Server] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(name: str, *flags: str, launcher: tuple[str, ...] = (sys.executable, "-m"),
              timeout: float = 120.0) -> Server:
        port = free_port()
        argv = [*launcher, "dlrt", "serve", "--model", str(tiny_sdar), "--dtype", "float32",
                "--port", str(port), *flags]
        server = Server(argv, port, name, logs / f"{name}.log",
                        tmp_path_factory.mktemp(f"{name}-tmp"))
        started.append(server)
        return server.wait_ready(timeout)

    yield start
    for server in started:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in _LIVE:
            report.sections.append((f"server {server.name} (pid {server.pid}) log",
                                    server.log()[-20000:]))
