"""FP8 KV cache on CUDA (GPU, marked `gpu`; sm_89+): device_loop, host_loop and eager commit
identical greedy tokens with kv_cache_dtype="fp8" (SDAR dense and MoE, LLaDA2, the LLaDA canvas
and dLLM-Var; contexts from a few tokens to thousands), the captured graphs read the per-layer
scales from device memory (new scales, same graphs, the modes still agree and the tokens
change), and a round makes no host sync. Helpers and the sharpened LM head (x50) are
`test_execution_modes`'s."""

from __future__ import annotations

import pytest
import torch
from test_execution_modes import _assert_same, _llm, _run_modes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.is_available()
                                 and torch.cuda.get_device_capability() < (8, 9),
                                 reason="FP8 loads in the Triton attention need sm_89+")]

STRATEGIES = ("low_confidence_dynamic", "threshold", "sequential")


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    return _llm(tiny_sdar, max_model_len=8192, kv_cache_dtype="fp8")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("prompt_len", [1, 6, 37, 3001])
def test_sdar_fp8_modes_identical(sdar, strategy, prompt_len):
    assert sdar.kv_cache.k.dtype == torch.float8_e4m3fn
    assert sdar.attention_backend == "triton"
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = _run_modes(sdar, prompt, max_new_tokens=24, temperature=0,
                     remasking_strategy=strategy, threshold=0.3)
    _assert_same(out)
    assert len(out["eager"][0]) == 24


@pytest.mark.parametrize("preset", ["tiny_sdar_moe", "tiny_llada2"])
@pytest.mark.parametrize("prompt_len", [5, 1100])
def test_moe_fp8_modes_identical(request, preset, prompt_len):
    llm = _llm(request.getfixturevalue(preset), max_model_len=4096, kv_cache_dtype="fp8")
    prompt = [(13 * i + 3) % 150000 for i in range(prompt_len)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=32, temperature=0, threshold=0.3,
                            ignore_eos=True))


@pytest.mark.parametrize("decoder,prompt_len", [("canvas", 21), ("dllm_var", 2000)])
def test_llada_fp8_modes_identical(tiny_llada, decoder, prompt_len):
    llm = _llm(tiny_llada, decoder=decoder, kv_cache_dtype="fp8")
    prompt = [(5 * i + 1) % 126000 for i in range(prompt_len)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=28, block_length=8, temperature=0,
                            remasking_strategy="low_confidence_dynamic", threshold=0.3))


def test_graphs_read_the_scales_from_memory(sdar):
    prompt = [(3 * i + 7) % 150000 for i in range(300)]
    opts = dict(max_new_tokens=24, temperature=0, remasking_strategy="threshold", threshold=0.3,
                ignore_eos=True)
    cache = sdar.kv_cache
    before = _run_modes(sdar, prompt, **opts)
    captures = sdar.executor.captures
    try:
        # |x| / 1e-3 saturates e4m3 (448) above 0.448: most of the RMS-normalised keys and the
        # values clamp, so attention and tokens change (all 24 in the CPU eager path; scales of
        # 0.01 and 3.0 changed 2 there and none on an H200)
        cache.k_scale.fill_(1e-3)
        cache.v_scale.fill_(1e-3)
        after = _run_modes(sdar, prompt, **opts)
    finally:
        cache.k_scale.fill_(1.0)
        cache.v_scale.fill_(1.0)
    _assert_same(before)
    _assert_same(after)
    assert sdar.executor.captures == captures  # no new capture for new scales
    assert after["device_loop"][0] != before["device_loop"][0]


def test_fp8_round_has_no_host_sync(sdar):
    sdar.set_execution_mode("eager")
    sdar.generate(list(range(9)), max_new_tokens=8, temperature=0)
    for prog in sdar.decoder._programs.values():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():
                prog.begin()
                prog.round()
                prog.end()
        finally:
            torch.cuda.set_sync_debug_mode(0)
