"""`round_kernel="persistent"` end to end (GPU, marked `gpu`): a dense SDAR checkpoint whose
head_dim the kernel serves (32) decodes with the block decoder's rounds and folded rounds on the
persistent kernel; device_loop, host_loop and eager commit identical greedy tokens (the kernel is
the same in all three), the tokens equal the layer path's in fp32 (the two differ only in fp32
summation order: identical unless a logit pair is within ~1e-6, which these prompts do not hit),
and in bf16 the tokens that differ from the layer path are counted and reported (rounding
points are the same; summation orders and the attention's p precision are not); the same for
weight-only FP8 projections. Models and precisions the kernel does not serve are refused by
name."""

from __future__ import annotations

import json

import pytest
import torch
from test_execution_modes import _assert_same, _run_modes

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import preset
from dlrt.errors import OptionError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    hf = preset("tiny-sdar")[0]
    hf.update(head_dim=32, hidden_size=96, intermediate_size=160, num_hidden_layers=3)
    src = tmp_path_factory.mktemp("cfg")
    (src / "config.json").write_text(json.dumps(hf))
    return make_checkpoint(src, tmp_path_factory.mktemp("wide") / "ckpt", dtype="float32")


def _pair(path, dtype):
    llms = {}
    for kind in ("layers", "persistent"):
        llm = LLM(path, device="cuda", dtype=dtype, max_model_len=4096, round_kernel=kind)
        llm.model.lm_head.weight.data *= 50
        llms[kind] = llm
    return llms


def _count_flips(out: dict, label: str, n: int) -> None:
    """Print how many of the persistent path's eager tokens differ from the layer path's;
    both decoded all n tokens."""
    a, b = out["persistent"]["eager"][0], out["layers"]["eager"][0]
    assert len(a) == len(b) == n
    flips = sum(x != y for x, y in zip(a, b, strict=True))
    print(f"{label} tokens differing from the layer path: {flips} of {n}")


@pytest.mark.parametrize("prompt_len", [1, 6, 37, 1500])
def test_fp32_tokens_equal_the_layer_path(wide_heads, prompt_len):
    llms = _pair(wide_heads, "float32")
    assert llms["persistent"].engine_config.round_kernel == "persistent"
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = {k: _run_modes(llm, prompt, max_new_tokens=24, temperature=0, ignore_eos=True,
                         remasking_strategy="low_confidence_static")
           for k, llm in llms.items()}
    _assert_same(out["persistent"])
    assert out["persistent"]["eager"] == out["layers"]["eager"]


def test_bf16_modes_identical_and_flips_counted(wide_heads):
    llms = _pair(wide_heads, "bfloat16")
    prompt = [(5 * i + 3) % 150000 for i in range(40)]
    out = {k: _run_modes(llm, prompt, max_new_tokens=48, temperature=0, ignore_eos=True,
                         remasking_strategy="low_confidence_static")
           for k, llm in llms.items()}
    _assert_same(out["persistent"])
    _count_flips(out, "bf16", 48)


def test_fp8_weight_only_modes_identical(wide_heads):
    """Weight-only FP8 projections on the kernel: the three execution modes commit the same
    tokens; the tokens differing from the layer path (its FP8 kernels sum in another order
    and precision) are counted."""
    llms = {kind: LLM(wide_heads, device="cuda", dtype="bfloat16", max_model_len=4096,
                      round_kernel=kind, quantization="fp8", fp8_activations="weight_only")
            for kind in ("layers", "persistent")}
    prompt = [(3 * i + 5) % 150000 for i in range(30)]
    out = {k: _run_modes(llm, prompt, max_new_tokens=32, temperature=0, ignore_eos=True,
                         remasking_strategy="low_confidence_static")
           for k, llm in llms.items()}
    _assert_same(out["persistent"])
    _count_flips(out, "fp8", 32)


def test_unserved_models_are_named(tiny_sdar_moe, tiny_sdar, wide_heads):
    with pytest.raises(OptionError, match="fp8_activations='weight_only'"):
        LLM(wide_heads, device="cuda", round_kernel="persistent", quantization="fp8")
    with pytest.raises(OptionError, match="quantization nvfp4"):
        LLM(wide_heads, device="cuda", round_kernel="persistent", quantization="nvfp4")
    with pytest.raises(OptionError, match="dense SDAR only"):
        LLM(tiny_sdar_moe, device="cuda", round_kernel="persistent")
    with pytest.raises(OptionError, match="head_dim 16"):
        LLM(tiny_sdar, device="cuda", round_kernel="persistent")
    assert torch.cuda.is_available()
