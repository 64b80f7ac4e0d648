"""`dlrt bench step --prompt-lengths` (the LLaDA canvas rounds: exact, smoothed, each cache's
refresh and window): each row's geometry and HBM floor by hand at LLaDA-8B's and
LLaDA-MoE-7B-A1B's real shapes, the program sizes against the canvas decoder's, the forwards a
timed round runs, whole runs on the CPU with the tiny presets, and the refusals (one `error:`
line, status 2)."""

import json

import pytest
import torch

from dlrt import LLM
from dlrt.bench.canvas_step import (
    PARTS,
    CanvasRound,
    _CanvasBench,
    canvas_floor_bytes,
    canvas_rounds,
    canvas_slots,
)
from dlrt.checkpoint.loader import materialize
from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve
from dlrt.entrypoints.cli import main
from dlrt.models.registry import build_model, model_config
from dlrt.ops import get_ops
from dlrt.resources import data_path
from dlrt.runtime.canvas_decoder import CanvasDecoder
from dlrt.runtime.runner import ModelRunner


@pytest.fixture(scope="module")
def tiny_llada_moe(tmp_path_factory):
    from dlrt.checkpoint.make import make_checkpoint

    return make_checkpoint("tiny-llada-moe", tmp_path_factory.mktemp("llada-moe") / "ckpt",
                           dtype="float32")


def params(**options):
    """A canvas request's resolved options (the canvas decoder's defaults)."""
    return resolve(DecodingOptions.from_kwargs(options),
                   DecoderDefaults(None, "low_confidence_static"), {}, (), 128, 0)


def real(name: str):
    """(config, the model built on the meta device in bf16) of a shipped config."""
    c = model_config(json.loads((data_path("configs") / name / "config.json").read_text()))
    with torch.device("meta"):
        model = build_model(c, get_ops("reference"))
    materialize(model, torch.bfloat16, torch.device("meta"))
    return c, model


def test_the_rows_of_a_request_by_hand():
    """P 1024, G 256, B 32: the exact round forwards the canvas (1280) with the LM head on the
    sub-block; prefix's window is P..T over the 1024 cached keys; dual's the sub-block alone,
    with a vicinity of 4 and 4 also the 4 positions on each side."""
    def rows(**kw):
        return [(r.cache, r.round, r.smoothing, r.start, r.tokens, r.keys, r.cached, r.lm_rows,
                 r.block) for r in canvas_rounds(1024, params(max_new_tokens=256,
                                                              block_length=32, **kw))]

    exact = ("none", "exact", False, 0, 1280, 1280, 0, 32, 32)
    assert rows() == [exact]
    assert rows(canvas_cache="prefix") == [
        exact, ("prefix", "refresh", False, 0, 1280, 1280, 0, 32, 32),
        ("prefix", "window", False, 1024, 256, 1280, 1024, 32, 32)]
    assert rows(canvas_cache="dual") == [
        exact, ("dual", "refresh", False, 0, 1280, 1280, 0, 32, 32),
        ("dual", "window", False, 1024, 32, 1280, 1248, 32, 32)]
    assert rows(canvas_cache="dual", vicinity_before=4, vicinity_after=4)[2] == (
        "dual", "window", False, 1020, 40, 1280, 1240, 32, 32)
    assert rows(smoothing=True, remasking_strategy="threshold") == [
        exact, ("none", "exact", True, 0, 1280, 1280, 0, 1280, 32)]
    # a vicinity before the sub-block is clipped to the prompt; after it, to the canvas
    (_, _, w) = canvas_rounds(3, params(max_new_tokens=8, block_length=4, canvas_cache="dual",
                                        vicinity_before=5, vicinity_after=6))
    assert (w.start, w.tokens, w.cached, w.vicinity_before) == (0, 11, 0, 3)


@pytest.mark.parametrize("prompt,gen,b,cache,before,after", [
    (1024, 256, 32, "none", 0, 0), (128, 256, 32, "prefix", 0, 0), (100, 250, 32, "prefix", 0, 0),
    (128, 256, 32, "dual", 0, 0), (1024, 256, 32, "dual", 4, 4), (3, 30, 8, "dual", 3, 9),
    (77, 64, 64, "dual", 0, 5)])
def test_the_programs_are_sized_as_the_decoder_sizes_them(prompt, gen, b, cache, before, after):
    p = params(max_new_tokens=gen, block_length=b, canvas_cache=cache,
               vicinity_before=before, vicinity_after=after)
    decoder = CanvasDecoder.__new__(CanvasDecoder)
    clipped = min(before, prompt)
    span, buffer, window = canvas_slots(prompt, gen, b, cache, clipped, after)
    assert span == decoder._size(prompt, p)
    assert (buffer, window) == decoder._buffer(prompt, p)


@pytest.mark.parametrize("kw", [{}, {"canvas_cache": "prefix"}, {"canvas_cache": "dual"},
                                {"canvas_cache": "dual", "vicinity_before": 4,
                                 "vicinity_after": 4},
                                {"smoothing": True, "remasking_strategy": "threshold"}])
def test_the_floor_of_each_llada_8b_row_by_hand(kw):
    """LLaDA-8B (bf16): V 126464, d 4096, 32 layers of fused QKV (3d x d), o (d x d), gate-up
    (2 x 12288 x d), down (d x 12288) and two norms; 32 KV heads of 128; the LM head (V x d)
    untied; no experts. P 1024, G 256, B 32."""
    c, model = real("LLaDA-8B-Instruct")
    v, d, f = 126464, 4096, 12288
    layer = 3 * d * d + d * d + 2 * f * d + d * f + 2 * d
    per_key = 32 * 2 * 32 * 128 * 2  # layers, K and V, heads, head size, bf16
    rows = canvas_rounds(1024, params(max_new_tokens=256, block_length=32, **kw))
    for r in rows:
        parts = canvas_floor_bytes(model, c, r, kv_item=2)
        assert parts["weights"] == 2 * (32 * layer + d) + r.tokens * d * 2
        assert parts["lm_head"] == v * d * 2 and parts["experts"] == 0
        assert parts["kv_read"] == r.cached * per_key
        assert parts["kv_write"] == r.tokens * per_key
        assert parts["logits"] == (r.lm_rows + 32) * v * 2
        soft = (1280 * v + v * d + 1280 * d) * 2  # logits read, E read, [T, d] written
        assert parts["soft"] == (soft if r.smoothing else 0)
        assert parts["total"] == sum(parts[k] for k in PARTS)
    window = rows[-1]
    if kw.get("canvas_cache") == "dual":  # the window reads the whole canvas's K/V
        assert window.cached + window.tokens == 1280


def test_the_floor_of_a_llada_moe_window_by_hand():
    """LLaDA-MoE-7B-A1B (bf16): V 157184, d 2048, 16 MoE layers of fused QKV (3 x 2048 x d),
    o, q/k norms (128 each), the router (64 x d) and 64 experts of 1024 (w13: 2 x 1024 x d,
    w2: d x 1024), top 8; 16 KV heads of 128. A dual window of 40 positions touches all 64
    experts of a layer, one of 4 positions at most 32."""
    c, model = real("LLaDA-MoE-7B-A1B-Instruct")
    v, d, e, i = 157184, 2048, 64, 1024
    layer = 3 * 2048 * d + d * 2048 + 2 * 128 + 64 * d + 2 * d
    per_key = 16 * 2 * 16 * 128 * 2
    for tokens, touched in ((40, 64), (4, 32)):
        r = CanvasRound(1024, 1280, "dual", "window", 1024 - 4, tokens, 1280, 32, 32, 4, 4)
        parts = canvas_floor_bytes(model, c, r, kv_item=2)
        assert parts["weights"] == 2 * (16 * layer + d) + tokens * d * 2
        assert parts["experts_touched"] == touched
        assert parts["experts"] == 16 * touched * 3 * d * i * 2
        assert parts["lm_head"] == v * d * 2
        assert (parts["kv_read"], parts["kv_write"]) == ((1280 - tokens) * per_key,
                                                         tokens * per_key)
        assert parts["logits"] == 64 * v * 2 and parts["soft"] == 0
        assert e == c.num_experts


def test_a_timed_round_runs_the_programs_forwards(tiny_llada, monkeypatch):
    """The exact row forwards the canvas at (0, T) with the LM head on the sub-block; the
    refresh row the canvas at (0, T); the window row (dual, vicinity 2 and 3) its window from
    P - 2 over keys < T, its logits the sub-block's; every round starts from the same canvas
    and leaves the counter and flag as a device loop of R rounds needs."""
    llm = LLM(str(tiny_llada), device="cpu", max_model_len=256)
    p = llm.resolve(DecodingOptions.from_kwargs(dict(
        max_new_tokens=30, block_length=8, canvas_cache="dual", vicinity_before=2,
        vicinity_after=3)))
    seen = []
    forward = ModelRunner.forward

    def spy(self, tokens, lens, chunk_block, rows=None, **kw):
        seen.append((tokens.shape[0], tuple(lens.tolist()),
                     rows if isinstance(rows, slice) else rows.tolist()))
        return forward(self, tokens, lens, chunk_block, rows, **kw)

    monkeypatch.setattr(ModelRunner, "forward", spy)
    exact, refresh, window = canvas_rounds(20, p)
    block = list(range(20, 28))
    with torch.inference_mode():
        for rnd, want in ((exact, (64, (0, 50), block)), (refresh, (64, (0, 50), block)),
                          (window, (13, (18, 50), slice(2, 10)))):
            bench = _CanvasBench(llm, p, rnd, rounds=2)
            seen.clear()
            bench.begin()
            bench.body()
            bench.body()
            assert seen == [want, want], rnd.round
            assert torch.equal(bench.p.canvas, bench.canvas)
            assert torch.equal(bench.p.canvas_masked, bench.masked)
            assert bench.p.state.round.item() == 0 and bench.flag.item() == 0


def step(model, tmp_path, *flags):
    out = tmp_path / "runs"
    argv = ["bench", "step", "--model", str(model), "--load-format", "dummy", "--device", "cpu",
            "--rounds", "2", "--out", str(out), *flags]
    assert main(argv) == 0
    (path,) = out.glob("step-*.json")
    return json.loads(path.read_text())


@pytest.mark.parametrize("flags,rounds", [
    (["--canvas-cache", "dual", "--vicinity-before", "2", "--vicinity-after", "3"],
     [("none", "exact", False), ("dual", "refresh", False), ("dual", "window", False)]),
    (["--canvas-cache", "prefix"],
     [("none", "exact", False), ("prefix", "refresh", False), ("prefix", "window", False)]),
    (["--smoothing", "--remasking-strategy", "threshold"],
     [("none", "exact", False), ("none", "exact", True)]),
    (["--canvas-cache", "dual", "--vicinity-before", "2", "--smoothing",
      "--remasking-strategy", "threshold"],
     [("none", "exact", False), ("none", "exact", True), ("dual", "refresh", True),
      ("dual", "window", True)])])
def test_the_rows_of_a_tiny_llada_run(tiny_llada, tmp_path, capsys, flags, rounds):
    """Per prompt length the rows of the request, each its eager round against its floor (the
    parts' bytes over the run's copy bandwidth) and over the exact row of its prompt."""
    rec = step(tiny_llada, tmp_path, "--prompt-lengths", "16,40", "--max-new-tokens", "30",
               "--block-length", "8", *flags)
    printed = capsys.readouterr().out
    assert "ratio_to_floor" in printed and "speedup" in printed and "kv_read_bytes" in printed
    assert rec["decoder"] == "canvas" and rec["prompt_lengths"] == [16, 40]
    assert rec["summary"]["timed"] == "eager" and rec["summary"]["block_length"] == 8
    c = LLM(str(tiny_llada), device="cpu", load_format="dummy").config
    bw = rec["summary"]["copy_bandwidth_TBps"] * 1e12
    for prompt in (16, 40):
        rows = [r for r in rec["rows"] if r["prompt"] == prompt]
        assert [(r["cache"], r["round"], r["smoothing"]) for r in rows] == rounds
        assert rows[0]["speedup"] == 1.0
        for r in rows:
            assert r["canvas"] == prompt + 30 and r["device_loop_us"] is None
            assert r["round_bytes"] == sum(r[f"{k}_bytes"] for k in PARTS)
            assert r["floor_us"] == pytest.approx(r["round_bytes"] / bw * 1e6)
            assert r["ratio_to_floor"] == pytest.approx(r["eager_us"] / r["floor_us"])
            assert r["speedup"] == pytest.approx(rows[0]["eager_us"] / r["eager_us"])
            per_key = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # fp32
            assert r["kv_write_bytes"] == r["tokens"] * per_key
    windows = [r for r in rec["rows"] if r["round"] == "window"]
    if "dual" in flags and "--smoothing" in flags:  # the LM head past the vicinity before
        assert [(w["tokens"], w["lm_rows"]) for w in windows] == [(10, 8), (10, 8)]
        refresh = [r for r in rec["rows"] if r["round"] == "refresh"]
        assert [r["lm_rows"] for r in refresh] == [46, 70]
        assert all(r["soft_bytes"] > 0 for r in windows + refresh)
    elif "dual" in flags:
        assert [(w["start"], w["tokens"]) for w in windows] == [(14, 13), (38, 13)]
    if "prefix" in flags:
        assert [(w["start"], w["tokens"]) for w in windows] == [(16, 30), (40, 30)]


def test_a_tiny_llada_moe_run(tiny_llada_moe, tmp_path):
    """LLaDA-MoE's dual cache: a window of 8 rows touches at most min(8, 4 * 8) experts."""
    rec = step(tiny_llada_moe, tmp_path, "--prompt-lengths", "24", "--max-new-tokens", "16",
               "--block-length", "8", "--canvas-cache", "dual")
    assert [(r["round"], r["tokens"], r["experts_touched"]) for r in rec["rows"]] == [
        ("exact", 40, 8), ("refresh", 40, 8), ("window", 8, 8)]
    assert all(r["experts_bytes"] > 0 for r in rec["rows"])


def refused(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_the_refusals(tiny_sdar, tiny_llada, capsys):
    cpu = ["--device", "cpu", "--load-format", "dummy"]
    err = refused(["bench", "step", "--model", str(tiny_sdar), *cpu, "--prompt-lengths", "16"],
                  capsys)
    assert "--prompt-lengths: times the 'canvas' decoder's rounds (LLaDA)" in err
    assert "'block'" in err
    err = refused(["bench", "step", "--model", str(tiny_sdar), *cpu, "--prompt-lengths", "16",
                   "--canvas-cache", "dual"], capsys)
    assert "--prompt-lengths: times the 'canvas' decoder's rounds" in err
    for flags in (["--canvas-cache", "dual"], ["--smoothing", "--remasking-strategy",
                                               "threshold"]):
        err = refused(["bench", "step", "--model", str(tiny_llada), *cpu, "--context", "64",
                       *flags], capsys)
        assert f"error: {flags[0]}: bench step times the canvas caches and smoothing per " \
               "prompt length" in err and "--prompt-lengths" in err
    err = refused(["bench", "step", "--model", str(tiny_llada), *cpu, "--prompt-lengths",
                   "16,4000", "--max-new-tokens", "256"], capsys)
    assert "--prompt-lengths: a prompt of 4000 and 256 new tokens need 4288 positions, " \
           "beyond the model's 4096" in err
    for flags in (["--prompt-lengths", "16", "--context", "64"], ["--prompt-lengths", "16,0"]):
        with pytest.raises(SystemExit) as parser_exit:  # the parser's own error line
            main(["bench", "step", "--model", str(tiny_llada), *flags])
        assert parser_exit.value.code == 2
        assert capsys.readouterr().err.startswith("error: dlrt bench step: argument ")
