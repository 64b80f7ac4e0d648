"""Fused kernels keep greedy tokens (GPU, marked `gpu`).

The same checkpoint decoded greedily with the fused Triton kernels and with the unfused PyTorch
ops (DLRT_FUSED_KERNELS=0) commits the same tokens. fp32 weights, where the kernels' rounding
differences (ulps of the fp32 statistics) cannot flip an argmax on these prompts; in bf16 a
near-tie can flip, which `dlrt bench humaneval` reports rather than a test asserting it.
With DLRT_SKINNY_GEMM=all every projection takes a Triton GEMM, and the dense SDAR model's
rounds (4 rows) run its layers as fused GEMVs (`dlrt.layers.gemv_layer`).
"""

from __future__ import annotations

import pytest

from dlrt import LLM

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("ckpt,decoder", [("tiny_sdar", None), ("tiny_sdar_moe", None),
                                          ("tiny_llada", "canvas"), ("tiny_llada", "dllm_var")])
@pytest.mark.parametrize("mode", ["eager", "device_loop"])
@pytest.mark.parametrize("projections", ["timed", "forced"])
def test_fused_equals_unfused_greedy(ckpt, decoder, mode, projections, request, monkeypatch):
    kw = {"decoder": decoder} if decoder else {}
    if projections == "forced":
        monkeypatch.setenv("DLRT_SKINNY_GEMM", "all")
    llm = LLM(request.getfixturevalue(ckpt), device="cuda", dtype="float32",
              max_model_len=2048, **kw)
    monkeypatch.delenv("DLRT_SKINNY_GEMM", raising=False)
    if projections == "forced" and ckpt == "tiny_sdar":  # dense layers, 4-row blocks
        assert llm.gemm_choices["layer"]["chosen"] == "fused"
    llm.set_execution_mode(mode)
    prompts = [[(13 * i + 5) % 1000 for i in range(n)] for n in (1, 7, 300)]
    opts = dict(max_new_tokens=24, temperature=0, block_length=4,
                remasking_strategy="low_confidence_dynamic", ignore_eos=True)
    fused = [llm.generate(p, **opts).token_ids for p in prompts]
    monkeypatch.setenv("DLRT_FUSED_KERNELS", "0")
    if mode != "eager":  # graphs hold the kernels they were captured with
        llm.set_execution_mode("eager")
    unfused = [llm.generate(p, **opts).token_ids for p in prompts]
    assert fused == unfused
    assert all(len(t) == 24 for t in fused)


@pytest.mark.parametrize("mode", ["eager", "device_loop"])
def test_fused_equals_unfused_sampling(tiny_sdar, mode, monkeypatch):
    """Seeded sampling (temperature, top-k, top-p): the fused draw (`dlrt.kernels.sampling`)
    commits the tokens of the PyTorch reference draw on the same noise."""
    llm = LLM(tiny_sdar, device="cuda", dtype="float32", max_model_len=2048)
    llm.set_execution_mode(mode)
    prompts = [[(13 * i + 5) % 1000 for i in range(n)] for n in (1, 7, 300)]
    runs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("DLRT_FUSED_KERNELS", fused)
        if fused == "0" and mode != "eager":
            llm.set_execution_mode("eager")
        runs[fused] = [[llm.generate(p, max_new_tokens=24, block_length=4, temperature=t,
                                     top_k=k, top_p=q, seed=11, ignore_eos=True).token_ids
                        for t, k, q in ((0.8, 50, 0.9), (1.2, 0, 0.95), (0.7, 0, 1.0))]
                       for p in prompts]
    assert runs["1"] == runs["0"]
