"""`dlrt bench step`'s CPU-side parts: the round's byte count (the HBM floor's parts, by hand
at DiffusionGemma-26B-A4B's real shape), the skipped-linear stand-in, its refusals (one
`error:` line, status 2) and a whole run on the CPU (the eager round against its floor)."""

import json

import pytest
import torch

from dlrt import LLM
from dlrt.bench.renoise_bytes import renoise_vocab_bytes
from dlrt.bench.step import PARTS, SkipLinear, floor_bytes, round_bytes
from dlrt.checkpoint.loader import materialize
from dlrt.entrypoints.cli import main
from dlrt.layers.quant.unquantized import CUBLAS
from dlrt.models.registry import build_model, model_config
from dlrt.ops import get_ops
from dlrt.resources import data_path


@pytest.mark.parametrize("b", [1, 4, 32])
def test_round_bytes_counts_the_experts_a_block_can_touch(tiny_sdar_moe, b):
    llm = LLM(tiny_sdar_moe, dtype="bfloat16")
    c = llm.config  # 8 experts, top-2, 2 MoE layers, moe_intermediate 32, hidden 64
    parts = round_bytes(llm, context=16, b=b)
    touched = min(c.num_experts, c.num_experts_per_tok * b)
    assert parts["experts_touched"] == touched
    per_expert = 3 * c.hidden_size * c.moe_intermediate_size * 2  # w13 + w2, bf16
    assert parts["experts"] == len(c.moe_layers) * touched * per_expert
    assert parts["lm_head"] == c.vocab_size * c.hidden_size * 2
    assert parts["kv"] == 2 * c.num_layers * (16 + b) * c.num_kv_heads * c.head_dim * 2
    assert parts["total"] == sum(parts[k] for k in ("weights", "lm_head", "experts", "kv"))


def test_skip_linear_replays_the_first_output_without_computing():
    layer = torch.nn.Linear(8, 3, bias=False)
    x = torch.randn(5, 8)
    calls = []

    class Counting(type(CUBLAS)):
        def apply(self, layer, x):
            calls.append(1)
            return super().apply(layer, x)

    skip = SkipLinear(Counting())
    first = skip.apply(layer, x)
    assert torch.allclose(first, x @ layer.weight.T)
    again = skip.apply(layer, torch.zeros(5, 8))
    assert again is first and len(calls) == 1  # no compute: the recorded output
    skip.apply(layer, torch.zeros(2, 8))  # another shape records again
    assert len(calls) == 2


@pytest.mark.parametrize("kv_cache_dtype,item", [("auto", 2), ("fp8", 1)])
def test_round_bytes_count_the_kv_cache_dtype(tiny_sdar, kv_cache_dtype, item):
    llm = LLM(tiny_sdar, dtype="bfloat16", kv_cache_dtype=kv_cache_dtype, max_model_len=64)
    c = llm.config
    parts = round_bytes(llm, context=32, b=4)
    assert parts["kv"] == 2 * c.num_layers * (32 + 4) * c.num_kv_heads * c.head_dim * item
    assert llm.kv_cache.k.element_size() == item


def test_a_bad_option_ends_with_one_error_line(tiny_sdar, capsys):
    argv = ["bench", "step", "--model", str(tiny_sdar), "--device", "cpu", "--context",
            "0,100000"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --context: 100000 + 2 blocks + 64 exceeds the model's ")
    assert err.count("\n") == 1


def real_diffusion_gemma(dtype=torch.bfloat16):
    """(config, the model built on the meta device in `dtype`) of the shipped config."""
    path = data_path("configs") / "DiffusionGemma-26B-A4B-it" / "config.json"
    c = model_config(json.loads(path.read_text()))
    with torch.device("meta"):
        model = build_model(c, get_ops("reference"))
    materialize(model, dtype, torch.device("meta"))
    return c, model


@pytest.mark.parametrize("context", [0, 500, 4096])
def test_the_floor_of_a_diffusion_gemma_round_at_the_real_shape(context):
    """Every part by hand from the config (bf16): V 262144, d 2816, 30 layers (every sixth full
    attention), 16 query heads; sliding layers 8 KV heads of 256 and window 1024, full layers
    2 KV heads of 512 with K = V (no v_proj); dense MLP 2112; 128 experts of 704, top 8;
    a canvas of 256 positions."""
    c, model = real_diffusion_gemma()
    n, v, d, dense, e, i = 256, 262_144, 2816, 2112, 128, 704
    full = [k for k in range(30) if (k + 1) % 6 == 0]
    assert [k for k in range(30) if not c.is_sliding(k)] == full == [5, 11, 17, 23, 29]
    parts = floor_bytes(model, c, context, n, kv_item=2)
    sliding_attn = (16 * 256 + 8 * 256 + 8 * 256) * d + d * 16 * 256 + 2 * 256  # qkv, o, norms
    full_attn = (16 * 512 + 2 * 512) * d + d * 16 * 512 + 2 * 512  # K = V: no v_proj
    layer = (3 * d * dense  # dense MLP: gate, up, down
             + 7 * d  # input, post-attention, pre/post feed-forward (1, 2) norms
             + e * d + d + e  # router: proj, scale, per-expert scale
             + 2)  # the decoder's layer scalar and the encoder's
    self_conditioning = 3 * d * dense + d  # its gated MLP and pre_norm (post_norm: no weight)
    weights = 25 * sliding_attn + 5 * full_attn + 30 * layer + d + self_conditioning
    assert parts["weights"] == 2 * weights + n * d * 2  # + the canvas's embedding rows
    assert parts["lm_head"] == v * d * 2  # tied: the whole embedding matrix
    assert parts["experts_touched"] == min(e, 8 * n) == 128
    assert parts["experts"] == 30 * 128 * 3 * d * i * 2
    window = min(context, 1024 - 1)  # the canvas's own K/V are not in the cache
    assert parts["kv"] == 25 * 2 * window * 8 * 256 * 2 + 5 * 2 * context * 2 * 512 * 2
    soft = 2 * n * v + 2 * v * d + 2 * n * d  # signal, E again, soft embeddings out
    draw = 4 * n * v + 2 * n * v + 20 * n  # fp32 logits, divided logits, sample/argmax/entropy
    assert parts["renoise"] == soft + draw
    assert parts["total"] == sum(parts[k] for k in PARTS)
    few = floor_bytes(model, c, context, 4, kv_item=2)  # 4 rows touch at most 32 experts
    assert few["experts_touched"] == 32 and few["experts"] == 30 * 32 * 3 * d * i * 2
    assert few["lm_head"] == parts["lm_head"]


def test_a_diffusion_gemma_step_on_the_cpu(tiny_diffusion_gemma, tmp_path, capsys):
    """The eager renoising round of the tiny preset (dummy weights) at two contexts: a record
    whose floor is its parts' bytes over the copy bandwidth of the run, the tied LM head read
    whole, a sliding layer's KV at most its window."""
    out = tmp_path / "runs"
    argv = ["bench", "step", "--model", str(tiny_diffusion_gemma), "--load-format", "dummy",
            "--context", "0,64", "--rounds", "2", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    assert "ratio_to_floor" in capsys.readouterr().out
    (path,) = out.glob("step-*.json")
    rec = json.loads(path.read_text())
    assert rec["decoder"] == "renoise" and rec["summary"]["timed"] == "eager"
    assert rec["summary"]["block_length"] == 16
    c = LLM(str(tiny_diffusion_gemma), device="cpu", load_format="dummy").config
    item = torch.empty((), dtype=getattr(torch, rec["dtype"].split(".")[-1])).element_size()
    bw = rec["summary"]["copy_bandwidth_TBps"] * 1e12
    for row, context in zip(rec["rows"], (0, 64), strict=True):
        assert row["context"] == context and row["device_loop_us"] is None
        assert row["round_bytes"] == sum(row[f"{k}_bytes"] for k in PARTS)
        assert row["floor_us"] == pytest.approx(row["round_bytes"] / bw * 1e6)
        assert row["ratio_to_floor"] == pytest.approx(row["eager_us"] / row["floor_us"])
        assert row["lm_head_bytes"] == c.vocab_size * c.hidden_size * item
        assert row["renoise_bytes"] == renoise_vocab_bytes(c, 16, dtype=getattr(
            torch, rec["dtype"].split(".")[-1]))["total"]
        # sliding layers (2 KV heads of 16, window 8): 7 keys; full (1 of 32): the context
        kv = 2 * (2 * min(context, 7) * 2 * 16 + 2 * context * 1 * 32) * item
        assert row["kv_bytes"] == kv and row["experts_touched"] == 4


def test_the_stage_variants_of_a_renoising_round(tiny_diffusion_gemma, monkeypatch):
    """What the GPU breakdown captures, run eagerly: within `sampling()` a round runs
    `denoise_canvas_round` twice, within `_repeated_moe` each layer's experts twice (the
    layer routes itself); every round reads the same canvas and leaves the counter and flag
    as a device loop of R rounds needs."""
    from dlrt.bench import step
    from dlrt.decoding.options import DecodingOptions
    from dlrt.runtime import renoise_decoder

    llm = LLM(str(tiny_diffusion_gemma), device="cpu", load_format="dummy", max_model_len=128)
    params = llm.resolve(DecodingOptions.from_kwargs({}))
    program = step._program(llm, params, 64)
    bench = step._RenoiseBench(llm, program, params, rounds=2)
    calls = {"round": 0, "experts": 0}
    real_round = renoise_decoder.denoise_canvas_round

    def counted_round(*args):
        calls["round"] += 1
        return real_round(*args)

    monkeypatch.setattr(renoise_decoder, "denoise_canvas_round", counted_round)
    layers = [m for m in llm.model.modules() if hasattr(m, "router")]
    for layer in layers:
        real_apply = layer.method.apply

        def counted_apply(*args, real_apply=real_apply):
            calls["experts"] += 1
            return real_apply(*args)

        monkeypatch.setattr(layer.method, "apply", counted_apply)
    with torch.inference_mode():
        bench.set_context(64)
        assert program.state.lens.tolist() == [64, 80] and bench.b == 16
        bench.begin()
        bench.body()
        assert calls == {"round": 1, "experts": len(layers)}
        with bench.sampling():
            bench.body()
        with step._repeated_moe(llm.model):
            bench.body()
    assert calls == {"round": 4, "experts": 4 * len(layers)}
    assert torch.equal(program.state.canvas, bench.init_tokens)
    assert program.state.round.item() == 0 and bench.flag.item() == 0
