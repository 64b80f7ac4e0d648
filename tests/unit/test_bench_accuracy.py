"""`dlrt bench accuracy` on the CPU: the dequantised reference is exact on the dequantising
path, the quantisation error lies in a stated range, and the JSON record has its fields."""

from __future__ import annotations

import json

import pytest

from dlrt.checkpoint.make import make_checkpoint
from dlrt.entrypoints.cli import main

# relative L2 error of the logits against the unquantised fp32 model, 21 positions: tiny random
# SDAR / SDAR-MoE models measure 0.024-0.034 (FP8) and 0.08-0.12 (NVFP4); the ranges are about
# a factor of two each way (an error near 0 would mean nothing was quantised)
RANGE = {"fp8": (0.01, 0.07), "nvfp4": (0.04, 0.25)}
FIELDS = {"commit", "device", "command", "model", "load_format", "num_tokens", "dtype",
          "num_layers", "vocab_size", "block", "rows"}
ROW_FIELDS = {"quantization", "rel_err_vs_dequantised", "rel_err_vs_unquantised",
              "argmax_agreement", "load_s", "forward_s"}


@pytest.mark.parametrize("source,extra", [
    ("tiny-sdar", []),
    ("tiny-sdar-moe", ["--load-format", "dummy", "--num-layers", "1"]),
])
def test_bench_accuracy(tmp_path, capsys, source, extra):
    model = make_checkpoint(source, tmp_path / "ckpt", dtype="float32")
    out = tmp_path / "runs"
    assert main(["bench", "accuracy", "--model", str(model), "--device", "cpu", "--dtype",
                 "float32", "--num-tokens", "21", "--out", str(out), *extra]) == 0
    printed = capsys.readouterr().out
    assert "rel_err_vs_dequantised" in printed and "nvfp4" in printed
    (path,) = out.glob(f"accuracy-{model.name}-*.json")
    record = json.loads(path.read_text())
    assert FIELDS <= record.keys()
    assert record["num_tokens"] == 21 and record["dtype"] == "float32"
    assert record["device"].startswith("cpu (") and record["torch_device"] == "cpu"
    assert record["num_layers"] == (1 if extra else 2)
    rows = {r["quantization"]: r for r in record["rows"]}
    assert list(rows) == ["none", "fp8", "fp8-weight_only", "nvfp4"]
    for q, (low, high) in RANGE.items():
        r = rows[q]
        assert ROW_FIELDS <= r.keys() and r["quantised_modules"] > 0
        if q == "fp8":  # dynamic activations: their quantisation error on top
            assert 1e-4 < r["rel_err_vs_dequantised"] < high, (q, r)
        else:
            assert r["rel_err_vs_dequantised"] < 1e-5, (q, r)
        assert low < r["rel_err_vs_unquantised"] < high, (q, r)
        assert 0.5 <= r["argmax_agreement"] <= 1.0, (q, r)


def test_bad_quantization(tmp_path, capsys):
    assert main(["bench", "accuracy", "--model", str(tmp_path), "--quantization", "int4"]) == 2
    assert capsys.readouterr().err == ("error: --quantization: expected some of fp8, "
                                       "fp8-weight_only, nvfp4, got 'int4'\n")


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_a_quantised_checkpoint_asks_for_the_unquantised_one(tmp_path, fmt, capsys):
    """The command measures quantisation against the unquantised model: a quantised folder is
    refused before any model loads, with what to give instead (not an engine option the
    command has no flag for), in one `error:` line with status 2."""
    model = make_checkpoint("tiny-sdar", tmp_path / "q", dtype="float32", quantization=fmt)
    assert main(["bench", "accuracy", "--model", str(model), "--device", "cpu",
                 "--num-tokens", "8", "--out", str(tmp_path / "runs")]) == 2
    msg = capsys.readouterr().err
    assert msg.startswith("error: --model: ") and msg.count("\n") == 1, msg
    assert f"holds {fmt} weights" in msg, msg
    assert "unquantised checkpoint" in msg and "quantization='auto'" not in msg, msg
