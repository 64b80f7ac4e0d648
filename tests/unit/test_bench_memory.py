"""`dlrt bench memory` on the CPU: the three phases' record (process RSS, the parameters'
storage, the KV cache), the tokens after each wake equal to those before, and with dummy
weights the level-2 wake left out."""

import json

from dlrt.entrypoints.cli import main


def _record(out) -> dict:
    (path,) = out.glob("memory-*.json")
    return json.loads(path.read_text())


def test_memory_phases_on_the_cpu(tiny_llada, tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["bench", "memory", "--model", str(tiny_llada), "--dtype", "float32", "--out",
            str(out), "--max-new-tokens", "8", "--quiet"]
    assert main(argv) == 0
    assert "sleep(2)" in capsys.readouterr().out
    rec = _record(out)
    awake, one, two = rec["rows"]
    assert [r["phase"] for r in rec["rows"]] == ["awake", "sleep(1)", "sleep(2)"]
    assert rec["measured"] == "rank 0" and rec["options"]["max_new_tokens"] == 8
    assert awake["kv_cache_bytes"] > 0 and one["kv_cache_bytes"] == two["kv_cache_bytes"] == 0
    assert awake["allocated_bytes"] is None and awake["rss_bytes"] > 0  # the CPU: RSS
    # level 1 keeps the weights in (CPU) memory; level 2 drops them
    assert one["weights_bytes"] == awake["weights_bytes"] > 1000 * two["weights_bytes"]
    assert one["tokens_equal"] is True and two["tokens_equal"] is True
    assert one["sleep_s"] >= 0 and two["wake_s"] >= 0


def test_dummy_weights_leave_out_the_level_2_wake(tiny_llada, tmp_path):
    out = tmp_path / "runs"
    argv = ["bench", "memory", "--model", str(tiny_llada), "--dtype", "float32", "--out",
            str(out), "--load-format", "dummy", "--max-new-tokens", "4", "--quiet"]
    assert main(argv) == 0
    two = _record(out)["rows"][2]
    assert two["wake_s"] is None and two["tokens_equal"] is None
