"""The programs in `examples/` run as a user runs them (subprocesses on the embedded default
model: `python`, against a `dlrt serve` process, under torchrun) and print what they promise:
the streamed blocks add up to the generated result, the NDJSON and OpenAI answers agree, and
the torchrun ranks produce the same tokens as one process."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Server, free_port

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MAX_NEW = 12  # three blocks of four
BLOCK = re.compile(r"block (\d+): (\d+) rounds, (\d+) tokens: (.*)")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def _env(tmp: Path) -> dict[str, str]:
    # NOTE: DLRT_CACHE_DIR (set by the conftest) passes through; this checkout's dlrt comes
    # first on the path, so the examples run against the dlrt they ship with; the temp dir is
    # the test's (torchrun leaves a torchelastic_* folder in it).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8",
                TMPDIR=str(tmp))


def run(*argv: str, tmp: Path, timeout: float = 180) -> str:
    """Run a command in its own process group (torchrun's ranks included) with `tmp` as its
    temp dir; its stdout."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            encoding="utf-8", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {timeout} s:\n{out}\n{err}")
    assert proc.returncode == 0, f"{argv} exited with {proc.returncode}:\n{out}\n{err}"
    return out


def sections(out: str) -> dict[str, list[str]]:
    """The output's lines under each `== title ==` header."""
    parts: dict[str, list[str]] = {}
    lines: list[str] = parts.setdefault("", [])
    for line in out.splitlines():
        if line.startswith("== ") and line.endswith(" =="):
            lines = parts.setdefault(line[3:-3], [])
        else:
            lines.append(line)
    return parts


def fields(lines: list[str]) -> dict[str, str]:
    """`name: value` lines (the last one of each name)."""
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def blocks(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """(index, rounds, tokens, text) of each `block ...` line."""
    out = []
    for line in lines:
        m = BLOCK.fullmatch(line)
        if m:
            out.append((int(m[1]), int(m[2]), int(m[3]), ast.literal_eval(m[4])))
    return out


def check_finish(reason: str, tokens: int) -> None:
    """A stop token ends the output early; "length" means exactly max_new_tokens."""
    assert reason in ("stop", "length"), reason
    assert tokens == MAX_NEW if reason == "length" else 0 <= tokens < MAX_NEW, (reason, tokens)


def check_result(lines: list[str]) -> dict[str, str]:
    """A printed GenerationResult is consistent; its fields."""
    f = fields(lines)
    check_finish(f["finish_reason"], int(f["tokens"]))
    assert float(f["TPS"]) > 0
    rounds = ast.literal_eval(f["rounds per block"])
    assert rounds and all(1 <= r <= 4 for r in rounds), rounds  # B = T = 4
    assert isinstance(ast.literal_eval(f["text"]), str)
    return f


def test_offline_generate(tmp_path):
    parts = sections(run(sys.executable, "examples/offline_generate.py",
                         "--max-new-tokens", str(MAX_NEW), tmp=tmp_path))
    assert {"text prompt", "chat", "stream"} <= set(parts), parts
    check_result(parts["text prompt"])
    chat = check_result(parts["chat"])

    # the streamed request is the chat request: its blocks add up to the chat result
    streamed = blocks(parts["stream"])
    assert [b[0] for b in streamed] == list(range(len(streamed)))
    assert "".join(b[3] for b in streamed) == ast.literal_eval(chat["text"])
    assert sum(b[2] for b in streamed) == int(chat["tokens"])
    assert [b[1] for b in streamed] == ast.literal_eval(chat["rounds per block"])
    assert fields(parts["stream"])["finish_reason"] == chat["finish_reason"]


def test_serve_client(tmp_path):
    port = free_port()
    server = Server([sys.executable, "-m", "dlrt", "serve", "--host", "127.0.0.1",
                     "--port", str(port)], port, "examples", tmp_path / "serve.log",
                    tmp_path)
    try:
        server.wait_ready()
        parts = sections(run(sys.executable, "examples/serve_client.py", "--base-url",
                             server.url, "--max-new-tokens", str(MAX_NEW), tmp=tmp_path))
    finally:
        server.stop()
    assert {"/generate (NDJSON)", "chat completion", "chat completion, streamed"} <= set(parts)

    ndjson = fields(parts["/generate (NDJSON)"])  # the final line's fields
    streamed = blocks(parts["/generate (NDJSON)"])
    check_finish(ndjson["finish_reason"], int(ndjson["completion_tokens"]))
    assert sum(b[2] for b in streamed) == int(ndjson["completion_tokens"])
    assert float(ndjson["TPS"]) > 0
    text = "".join(b[3] for b in streamed)

    # the same messages and options, greedy: the OpenAI answers are the NDJSON answer
    chat = fields(parts["chat completion"])
    assert ast.literal_eval(chat["content"]) == text
    assert chat["finish_reason"] == ndjson["finish_reason"]
    assert chat["completion_tokens"] == ndjson["completion_tokens"]
    deltas = [ast.literal_eval(line.split(": ", 1)[1])
              for line in parts["chat completion, streamed"] if line.startswith("delta: ")]
    assert "".join(deltas) == text
    assert fields(parts["chat completion, streamed"])["finish_reason"] == chat["finish_reason"]
    assert server.log().count("status=ok") == 3, server.log()


def test_torchrun_generate(tmp_path):
    args = ("examples/torchrun_generate.py", "--max-new-tokens", str(MAX_NEW))
    two = fields(run(*TORCHRUN, *args, tmp=tmp_path).splitlines())
    assert two["world"] == "2"
    assert two["ranks agree"] == "True"
    per_rank = ast.literal_eval(two["tokens per rank"])
    assert len(per_rank) == 2 and per_rank[0] == per_rank[1], per_rank
    check_finish(two["finish_reason"], per_rank[0])

    # one process (world 1) generates the same greedy text
    one = fields(run(sys.executable, *args, tmp=tmp_path).splitlines())
    assert one["world"] == "1" and one["ranks agree"] == "True"
    assert one["text"] == two["text"]
