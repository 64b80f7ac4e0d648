"""`dlrt bench step`'s CPU-side parts: the round's byte count, the skipped-linear stand-in and
its refusals (one `error:` line, status 2)."""

import pytest
import torch

from dlrt import LLM
from dlrt.bench.step import SkipLinear, round_bytes
from dlrt.entrypoints.cli import main
from dlrt.layers.quant.unquantized import CUBLAS


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


def test_a_bad_option_ends_with_one_error_line(tiny_sdar, monkeypatch, capsys):
    argv = ["bench", "step", "--model", str(tiny_sdar), "--device", "cpu", "--context", "0"]
    if not torch.cuda.is_available():
        assert main(argv) == 2
        assert capsys.readouterr().err == "error: dlrt bench step needs a CUDA GPU\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # refused before any GPU use
    argv[-1] = "0,100000"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --context: 100000 + 2 blocks + 64 exceeds the model's ")
    assert err.count("\n") == 1
