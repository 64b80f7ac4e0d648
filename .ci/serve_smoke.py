"""`dlrt serve` smoke test with the standard library only: start the given `dlrt` executable on
a free port (embedded default model), wait for /health, check a streamed NDJSON /generate, an
OpenAI chat completion and a 400 for a bad field, then stop the server.

Usage: python serve_smoke.py PATH_TO_DLRT
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main(dlrt: str) -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([dlrt, "serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {proc.stdout.read()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server not ready after 300 s")
            time.sleep(0.5)
        status, body = post(url + "/generate", {"prompt": "def add(a, b):",
                                                "max_new_tokens": 8, "temperature": 0})
        lines = [json.loads(x) for x in body.decode().splitlines() if x]
        assert status == 200 and lines[-1]["type"] == "final", lines
        blocks = [x for x in lines if x["type"] == "block"]
        assert sum(len(b["token_ids"]) for b in blocks) == lines[-1]["completion_tokens"]
        status, body = post(url + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        reply = json.loads(body)
        assert status == 200 and reply["choices"][0]["finish_reason"] in ("stop", "length")
        status, body = post(url + "/generate", {"prompt": "x", "max_new_tokens": 0})
        assert status == 400 and json.loads(body)["error"]["param"] == "max_new_tokens", body
        print(f"wheel: dlrt serve answered /generate ({len(blocks)} blocks), "
              "/v1/chat/completions and a 400")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
