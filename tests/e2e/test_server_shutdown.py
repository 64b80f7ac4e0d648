"""Stopping `dlrt serve` with SIGINT while it works, as a user at the terminal does: the first
SIGINT logs how many requests run and wait and drains them (each answered in full), a second
one answers the queued clients with a 503 in the OpenAI error shape and cancels the running
request at its next block; the process ends with status 130 and no traceback, after the
generation thread has stopped. A third one stops at once, even while a block never ends."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples

HOLD = {"prompt": "hold the server", "ignore_eos": True, "temperature": 0}
HUNG = Path(__file__).resolve().parents[1] / "unit" / "serve_hung.py"


def request(url: str, path: str, body: dict, out: list) -> threading.Thread:
    """POST in a thread; `out` gets (status, the JSON answer or the NDJSON lines)."""
    def run():
        with httpx.Client(timeout=120) as c, c.stream("POST", url + path, json=body) as r:
            text = r.read().decode()
        rows = ([json.loads(line) for line in text.splitlines() if line]
                if r.headers["content-type"].startswith("application/x-ndjson")
                else json.loads(text))
        out.append((r.status_code, rows))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def busy(server, running_tokens: int) -> tuple[list, list, list[threading.Thread]]:
    """One request running (`running_tokens` new tokens) and two queued behind it (a
    /generate and a /v1/completions); their outcome lists and threads."""
    running, queued = [], []
    threads = [request(server.url, "/generate", {**HOLD, "max_new_tokens": running_tokens},
                       running)]
    server.wait_for(lambda h: h["running"] == 1, what="running == 1")
    threads.append(request(server.url, "/generate", {"prompt": "queued", "max_new_tokens": 8,
                                                     "temperature": 0}, queued))
    server.wait_for(lambda h: h["waiting"] == 1, what="waiting == 1")
    threads.append(request(server.url, "/v1/completions", {"prompt": "queued", "max_tokens": 8,
                                                           "temperature": 0}, queued))
    server.wait_for(lambda h: h["waiting"] == 2, what="waiting == 2")
    return running, queued, threads


def test_first_sigint_drains_the_running_and_queued_requests(start_server):
    server = start_server("drain", "--max-queue", "4")
    running, queued, threads = busy(server, running_tokens=96)
    os.kill(server.pid, signal.SIGINT)
    server.wait_log("SIGINT: stopping; draining 1 running and 2 queued request(s)")
    for t in threads:
        t.join(120)
    (status, rows), = running
    assert status == 200 and rows[-1]["type"] == "final", rows[-1]
    assert rows[-1]["finish_reason"] == "length" and rows[-1]["completion_tokens"] == 96
    assert sorted(s for s, _ in queued) == [200, 200], queued
    assert server.proc.wait(60) == 130
    log = server.log()
    assert log.count("finish=length status=ok") == 3 and "Traceback" not in log, log


def test_second_sigint_refuses_the_queued_requests_with_503(start_server):
    server = start_server("refuse", "--max-queue", "4")
    running, queued, threads = busy(server, running_tokens=4000)
    os.kill(server.pid, signal.SIGINT)
    server.wait_log("draining 1 running and 2 queued request(s)")
    os.kill(server.pid, signal.SIGINT)
    server.wait_log("SIGINT again: refusing 2 queued request(s) with 503")
    for t in threads:
        t.join(60)
    assert len(queued) == 2, queued
    for status, answer in queued:
        assert status == 503, answer
        error = answer["error"]
        assert error["type"] == "server_error" and error["code"] == 503, answer
        assert "shutting down" in error["message"] and error["param"] is None, answer
    (status, rows), = running
    assert status == 200 and rows[-1]["finish_reason"] == "cancelled", rows[-1]
    assert server.proc.wait(60) == 130
    log = server.log()
    # the generation thread stopped (its request line) before the process ended
    assert "status=cancelled" in log and "Traceback" not in log, log


def test_third_sigint_stops_at_once_while_a_block_never_ends(start_server):
    server = start_server("hung", launcher=(sys.executable, str(HUNG)))

    def hold():
        try:
            with httpx.Client(timeout=120) as c:
                c.post(server.url + "/generate", json={**HOLD, "max_new_tokens": 64})
        except httpx.HTTPError:  # the server went away
            pass

    threading.Thread(target=hold, daemon=True).start()
    server.wait_for(lambda h: h["running"] == 1, what="running == 1")
    os.kill(server.pid, signal.SIGINT)
    server.wait_log("draining 1 running and 0 queued request(s)")
    os.kill(server.pid, signal.SIGINT)
    server.wait_log("SIGINT again: refusing 0 queued request(s)")
    start = time.monotonic()
    os.kill(server.pid, signal.SIGINT)
    assert server.proc.wait(20) == 130
    assert time.monotonic() - start < 10
    log = server.log()
    assert log.count("SIGINT a third time: stopping at once") == 1 and "Traceback" not in log, log
