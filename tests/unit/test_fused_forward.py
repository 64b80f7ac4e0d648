"""The fused-kernel forward equals the unfused one on whole models.

On the CPU the layers take the PyTorch ops; here they are switched to the Triton kernels (run by
the interpreter) to check the wiring: merged projections through the skinny GEMM (9 rows, "dot")
or the GEMV (4 rows, "fma"), or whole dense layers as fused GEMVs (`dlrt.layers.gemv_layer`:
norms, SiLU and residual adds inside the projections; on all layers, or on one layer so that
the stream crosses between the fused and the classic form in both directions), residual
plumbing through the fused RMSNorm, q/k norm + RoPE + cache write, SiLU-and-mul. fp32 weights;
logits within 1e-4 relative, and the cache holds the same K/V.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.kernels.skinny_gemm import GemmConfig  # noqa: E402
from dlrt.layers import attention, gemv_layer, linear, mlp, norm  # noqa: E402


def forward(llm: LLM, tokens: torch.Tensor, chunk_block: int | None):
    logits = llm.runner.forward_at(tokens, 3, chunk_block)
    cache = llm.runner.cache
    return logits, cache.k.clone(), cache.v.clone()


GEMMS = {"dot": (9, GemmConfig(16, 16, 2)),
         "gemv": (4, GemmConfig(4, 32, 1, stages=2, kind="fma")),
         "gemv_layer": (4, GemmConfig(8, 32, 1, stages=3, kind="fma"))}


MODELS = [("tiny_sdar", 4), ("tiny_sdar_moe", 4), ("tiny_llada", None)]
CASES = [(*m, gemm, None) for m in MODELS for gemm in ("dot", "gemv")] + [
    (*m, "gemv_layer", layers) for m in (MODELS[0], MODELS[2]) for layers in ("all", 0, 1)]


@pytest.mark.parametrize("ckpt,chunk_block,gemm,fused_layers", CASES)
def test_fused_forward_matches_unfused(ckpt, chunk_block, gemm, fused_layers, request,
                                       monkeypatch):
    llm = LLM(request.getfixturevalue(ckpt), max_model_len=64)
    gen = torch.Generator().manual_seed(5)
    n, cfg = GEMMS[gemm]
    tokens = torch.randint(0, llm.config.vocab_size, (n,), generator=gen)
    ref = forward(llm, tokens, chunk_block)
    llm.runner.cache.k.zero_()
    llm.runner.cache.v.zero_()
    for module in (attention, mlp, norm, linear, gemv_layer):
        monkeypatch.setattr(module, "use_kernels", lambda x: True)
    for p in llm.model.parameters():  # the layers' projections via the skinny GEMM
        if p.dim() == 2 and p.shape[1] % 32 == 0 and p.shape[0] <= 1024:
            monkeypatch.setitem(linear.CHOICES, (*p.shape, p.dtype), cfg)
    fused = []
    if gemm == "gemv_layer":  # both tiny models have two dense layers
        layers = [m for m in llm.model.modules() if callable(getattr(m, "dense_weights", None))]
        for i, m in enumerate(layers):
            if fused_layers in ("all", i):
                monkeypatch.setattr(m, "gemvs", gemv_layer.LayerGEMVs(cfg, cfg, cfg, cfg))
                fused.append(m)
        assert len(layers) == 2 and fused
        calls = []
        real = gemv_layer.forward
        monkeypatch.setattr(gemv_layer, "forward", lambda *a: calls.append(1) or real(*a))
    out = forward(llm, tokens, chunk_block)
    if fused:
        assert len(calls) == len(fused)  # every dense layer took the fused form
    for a, b in zip(out, ref, strict=True):
        err = (a - b).abs().max() / b.abs().max()
        assert err < 1e-4, float(err)
    assert ref[1][:, 0, 3:3 + n].abs().sum() > 0  # the chunk's K/V were written


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic",
                                      "threshold", "dynamic_pmax"])
def test_greedy_round_kernel_matches_probabilities(strategy, monkeypatch):
    """A greedy round through `dlrt.kernels.greedy` commits what the fp32 softmax path does."""
    from dlrt.decoding import round as round_mod
    from dlrt.decoding.round import RoundSpec, denoise_round
    from dlrt.decoding.sampling import SamplingSpec
    from dlrt.decoding.strategies import StrategySpec

    spec = RoundSpec(StrategySpec(strategy, 0.3, 0.5), SamplingSpec(0.0, 0, 1.0, 0), steps=4)
    gen = torch.Generator().manual_seed(11)
    for trial in range(5):
        logits = torch.randn(8, 3000, generator=gen) * (1 + 3 * trial)
        tokens = torch.full((8,), 7, dtype=torch.int64)
        masked = torch.rand(8, generator=gen) < 0.8
        args = (spec, logits, tokens, masked, torch.arange(8), 1, 2)
        ref = denoise_round(*args)
        monkeypatch.setattr(round_mod, "use_kernels", lambda x: True)
        out = denoise_round(*args)
        monkeypatch.undo()
        for a, b in zip(out, ref, strict=True):
            assert torch.equal(a, b)
        assert ref[2].any()  # something was committed
