"""`dlrt serve --data-parallel-size 2` under torchrun with two CPU ranks (two whole engines):
rank 0 serves HTTP and hands a request to the other group while its own runs one, so two
requests run at once, each answered as one process answers it; a request that fails on a
group fails alone, and that group serves the next ones."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_server_torchrun import TORCHRUN, _nan_row_copy

from dlrt import LLM

pytestmark = pytest.mark.slow  # torchrun subprocesses

LONG = {"max_new_tokens": 48, "ignore_eos": True, "temperature": 0}
# long enough for two requests to overlap on a loaded 2-core machine
LONGER = {**LONG, "max_new_tokens": 320}


def stream(url: str, body: dict, out: dict) -> None:
    """POST /generate; `out`: the rows and when the first and the last arrived."""
    with httpx.Client(timeout=120) as c, c.stream("POST", url + "/generate", json=body) as r:
        out["status"] = r.status_code
        rows = []
        for line in r.iter_lines():
            if line:
                rows.append(json.loads(line))
                out.setdefault("first", time.monotonic())
        out["end"], out["rows"] = time.monotonic(), rows


def group_requests(url: str) -> dict[str, float]:
    """{group: requests it finished or failed} from /metrics."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("dlrt_group_requests_total{"):
            out[line.split('group="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def tokens(rows: list[dict]) -> list[int]:
    return [t for row in rows if row["type"] == "block" for t in row["token_ids"]]


def test_two_groups_serve_two_requests_at_once(start_server, tiny_sdar, tmp_path):
    nan = _nan_row_copy(Path(tiny_sdar), tmp_path / "nan", token=7)  # prompt [7, ...] fails
    llm = LLM(nan, dtype="float32")
    server = start_server("dp", "--model", str(nan), "--data-parallel-size", "2",
                          launcher=TORCHRUN)
    server.wait_log("rank 1 leading data-parallel group 1")
    assert "(2 rank(s), 2 data-parallel groups)" in server.log()
    prompts = {"a": [1, 2, 3, 4, 5], "b": [9, 8, 6], "c": [11, 12, 13, 14]}
    want = {k: llm.generate(p, **(LONG if k == "a" else LONGER)).token_ids
            for k, p in prompts.items()}

    # group 0 runs "a"; the failing request goes to the idle group 1 and fails alone
    a: dict = {}
    runner = threading.Thread(target=stream, args=(server.url, {"input_ids": prompts["a"],
                                                                **LONG}, a))
    runner.start()
    server.wait_for(lambda h: h["running"] == 1, what="running == 1")
    with httpx.Client(timeout=60) as c:
        bad = c.post(server.url + "/v1/completions",
                     json={"prompt": [7, 7, 7], "max_tokens": 8, "temperature": 0})
    assert bad.status_code >= 500 and "non-finite" in bad.text, bad.text
    runner.join(120)
    assert a["status"] == 200 and tokens(a["rows"]) == want["a"]
    assert group_requests(server.url) == {"0": 1.0, "1": 1.0}

    # two requests at once: both groups run, each answering as one process does
    seen, results = [], {k: {} for k in ("b", "c")}
    threads = [threading.Thread(target=stream, args=(server.url, {"input_ids": prompts[k],
                                                                  **LONGER}, results[k]))
               for k in results]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(server.health()["running"])
        time.sleep(0.02)
    assert max(seen) == 2, seen
    b, c = results["b"], results["c"]
    assert max(b["first"], c["first"]) < min(b["end"], c["end"])  # both in flight at once
    assert tokens(b["rows"]) == want["b"] and tokens(c["rows"]) == want["c"]
    assert group_requests(server.url) == {"0": 2.0, "1": 2.0}
