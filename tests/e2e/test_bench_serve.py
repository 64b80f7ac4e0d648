"""`dlrt bench serve` end to end on the CPU: the embedded default model in this process,
then a real `dlrt serve` subprocess (uvicorn) spoken to over HTTP; 2 prompts, few tokens."""

from __future__ import annotations

import json

import pytest

from dlrt.entrypoints.cli import main as cli_main

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples


def test_bench_serve_end_to_end(tmp_path, capsys, monkeypatch):
    # NOTE: one OpenMP thread in this process and the server: the machine's cores are shared.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "results"
    assert cli_main(["bench", "serve", "--num-prompts", "2", "--max-new-tokens", "8",
                     "--temperature", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "direct" in text and "http" in text and "mean_ttfb_ms" in text
    (path,) = out.glob("serve-*.json")
    record = json.loads(path.read_text())
    assert {"commit", "device", "command"} <= set(record)
    assert set(record["modes"]) == {"direct", "http"}
    assert record["same_tokens"] is True
    for mode in ("direct", "http"):
        summary = record["modes"][mode]["summary"]
        assert summary["requests"] == 2 and summary["mean_tps"] > 0
        assert summary["mean_ttfb_ms"] > 0 and 0 < summary["tokens"] <= 16
    assert record["modes"]["http"]["summary"]["mean_server_tps"] > 0
    assert [r["same_tokens"] for r in record["compare"] if r["mode"] == "http"] == [True]
