"""The Triton ops table's forward equals the reference table's on whole models.

On the CPU an LLM takes the PyTorch ops; here a second LLM of the same checkpoint takes the
Triton ops (`kernels="triton"`, run by the interpreter), and its linear layers a plan that puts
the projections on the skinny GEMM (9 rows, "dot") or the GEMV (4 rows, "fma"): the wiring of
merged projections, residual plumbing through the fused RMSNorm, q/k norm + RoPE + cache write,
SiLU-and-mul. fp32 weights; logits within 1e-4 relative, and the caches hold the same K/V.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.decoding.round import RoundSpec, denoise_round  # noqa: E402
from dlrt.decoding.sampling import SamplingSpec  # noqa: E402
from dlrt.decoding.strategies import StrategySpec  # noqa: E402
from dlrt.kernels.skinny_gemm import GemmConfig  # noqa: E402
from dlrt.layers.quant.unquantized import SkinnyGemmLinear  # noqa: E402
from dlrt.tuning.linear import LinearPlan, linear_layers  # noqa: E402


def forward(llm: LLM, tokens: torch.Tensor, chunk_block: int | None):
    logits = llm.runner.forward_at(tokens, 3, chunk_block)
    cache = llm.runner.cache
    return logits, cache.k.clone(), cache.v.clone()


GEMMS = {"dot": (9, GemmConfig(16, 16, 2)),
         "gemv": (4, GemmConfig(4, 32, 1, stages=2, kind="fma"))}
MODELS = [("tiny_sdar", 4), ("tiny_sdar_moe", 4), ("tiny_llada", None)]


def skinny_plan(llm: LLM, cfg: GemmConfig) -> LinearPlan:
    """The skinny GEMM on every projection it fits (the LM head stays on cuBLAS: too wide
    for the interpreter to be quick)."""
    method = SkinnyGemmLinear(cfg)
    return LinearPlan({name: method for name, m in linear_layers(llm.model).items()
                       if m.weight.shape[1] % 32 == 0 and m.weight.shape[0] <= 1024})


@pytest.mark.parametrize("ckpt,chunk_block", MODELS)
@pytest.mark.parametrize("gemm", list(GEMMS))
def test_triton_forward_matches_reference(ckpt, chunk_block, gemm, request):
    path = request.getfixturevalue(ckpt)
    ref_llm = LLM(path, max_model_len=64)
    llm = LLM(path, max_model_len=64, kernels="triton")
    assert ref_llm.engine.ops.name == "reference" and llm.engine.ops.name == "triton"
    n, cfg = GEMMS[gemm]
    plan = skinny_plan(llm, cfg)
    plan.apply(llm.model)
    assert len(plan.methods) >= 4
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, llm.config.vocab_size, (n,), generator=gen)
    ref = forward(ref_llm, tokens, chunk_block)
    out = forward(llm, tokens, chunk_block)
    for a, b in zip(out, ref, strict=True):
        err = (a - b).abs().max() / b.abs().max()
        assert err < 1e-4, float(err)
    assert ref[1][:, 0, 3:3 + n].abs().sum() > 0  # the chunk's K/V were written


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic",
                                      "threshold", "dynamic_pmax", "credit", "hierarchical"])
def test_greedy_round_kernel_matches_probabilities(strategy):
    """A greedy round through the Triton table's candidates (`dlrt.kernels.greedy`) commits
    what the fp32 softmax path does."""
    from dlrt.ops import triton as triton_ops

    spec = RoundSpec(StrategySpec(strategy, 0.3, 0.5), SamplingSpec(0.0, 0, 1.0, 0), steps=4)
    gen = torch.Generator().manual_seed(11)
    for trial in range(5):
        logits = torch.randn(8, 3000, generator=gen) * (1 + 3 * trial)
        tokens = torch.full((8,), 7, dtype=torch.int64)
        masked = torch.rand(8, generator=gen) < 0.8
        args = (spec, logits, tokens, masked, torch.arange(8), 1, 2)
        credit = torch.rand(8, 3000, generator=gen) * trial  # as after earlier rounds
        ref_credit, out_credit = credit.clone(), credit.clone()
        ref = denoise_round(*args, credit=ref_credit)
        out = denoise_round(*args, candidates_op=triton_ops.candidates, credit=out_credit)
        for a, b in zip(out, ref, strict=True):
            assert torch.equal(a, b)
        # the kernel's max probability may differ from the softmax's by an ulp
        assert torch.allclose(out_credit, ref_credit, rtol=1e-6, atol=0)
        assert ref[2].any()  # something was committed
