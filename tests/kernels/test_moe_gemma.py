"""The Triton MoE path for DiffusionGemma's experts against the model's PyTorch MoE.

DiffusionGemma routes with its own router (`DiffusionGemmaRouter`: logits from a weightless
RMSNorm, a scale and H^-0.5; softmax over the E experts, top-k, renormalised, then each weight
times its expert's `per_expert_scale`) and runs gated experts of transformers'
gelu_pytorch_tanh. Checked: the routing kernel with a per-expert scale == `route` times the
scale (exact ids, weights within 1e-6), ties included; the fused experts of that activation in
both forms (rows / GEMV, tiles / grouped GEMM) == `ReferenceMoE.apply`; and the model's router
and experts through the `triton` ops table's method == through the reference's. Fresh random
inputs; fp32 under TRITON_INTERPRET=1 on the CPU at tiny shapes (fp32 max error < 1e-5 of the
output's max); on the GPU the real shape (E 128, top-8, H 2816, I 704, a 256-position canvas)
in bf16 (within 2 bf16 ulps of the output's scale) and a CUDA-graph replay equal to eager.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import assert_replay_matches_eager  # noqa: E402

from dlrt.kernels.moe import MoEConfig, fused_experts  # noqa: E402
from dlrt.kernels.moe_route import route_topk  # noqa: E402
from dlrt.layers.moe import StackedExperts, moe_method  # noqa: E402
from dlrt.layers.moe.base import RouterSpec  # noqa: E402
from dlrt.layers.moe.reference import ReferenceMoE, route  # noqa: E402
from dlrt.layers.moe.triton import TritonMoE  # noqa: E402
from dlrt.models.diffusion_gemma.config import diffusion_gemma_config  # noqa: E402
from dlrt.models.diffusion_gemma.layers import (  # noqa: E402
    DiffusionGemmaLayer,
    DiffusionGemmaRouter,
)
from dlrt.ops import get_ops  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GELU = "gelu_pytorch_tanh"
E, K, H, INTER = 8, 2, 64, 32  # tiny layer for the interpreter
FORMS = {"rows": MoEConfig("rows", rows=2, up_n=16, up_k=32, down_n=16, down_k=16),
         "tiles": MoEConfig("tiles", block_m=16, up_n=16, up_k=32, down_n=32, down_k=16)}


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = ref.float().abs().max().clamp_min(1e-6)
    err = float((out.float() - ref.float()).abs().max() / scale)
    assert err < (2 * 2**-8 if out.dtype == torch.bfloat16 else 1e-5), err


def gemma_config(experts: int, top_k: int, hidden: int, inter: int):
    return diffusion_gemma_config({"text_config": dict(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
        num_experts=experts, top_k_experts=top_k, moe_intermediate_size=inter)})


def gemma_moe(experts=E, top_k=K, hidden=H, inter=INTER, dtype=torch.float32, seed=0):
    """(router, layer holding the experts) of DiffusionGemma with random weights: the router's
    scale and per-expert scale off 1."""
    c = gemma_config(experts, top_k, hidden, inter)
    gen = torch.Generator().manual_seed(seed)
    router = DiffusionGemmaRouter(c)
    ex = StackedExperts(experts, hidden, inter, activation=GELU, stacked=True)
    with torch.no_grad():
        router.proj.weight.copy_(torch.randn(experts, hidden, generator=gen))
        router.scale.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
        router.per_expert_scale.copy_(1 + 0.3 * torch.randn(experts, generator=gen))
        for p in (ex.w13, ex.w2):
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    router = router.to(DEV, dtype).requires_grad_(False)
    return router, SimpleNamespace(experts=ex.to(DEV, dtype).requires_grad_(False))


@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("e,k", [(8, 2), (16, 4), (12, 1)])
def test_route_kernel_with_expert_scale(n, e, k):
    gen = torch.Generator().manual_seed(e * 10 + n)
    logits = torch.randn(n, e, generator=gen) * 2
    logits[0, :] = 0.5  # a row of ties: the lowest ids
    scale = 1 + 0.3 * torch.randn(e, generator=gen)
    spec = RouterSpec("softmax", e, k)
    w, ids = route_topk(logits.to(DEV), k, "softmax", expert_scale=scale.to(DEV))
    rw, rids = route(spec, logits, None)
    assert torch.equal(ids.cpu(), rids)
    torch.testing.assert_close(w.cpu(), rw * scale[rids], rtol=0, atol=1e-6)
    assert ids[0].tolist() == list(range(k))
    with pytest.raises(ValueError, match="expert_scale must be a contiguous"):
        route_topk(logits.to(DEV), k, "softmax", expert_scale=scale[:-1].to(DEV))


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("n", [1, 5, 19])
def test_gelu_experts_match_reference(n, form):
    _, layer = gemma_moe(seed=n)
    gen = torch.Generator().manual_seed(100 + n)
    x = (torch.randn(n, H, generator=gen) * 2).to(DEV)
    weights = torch.rand(n, K, generator=gen).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(n)]).to(DEV)
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    check(TritonMoE(lambda *_, c=FORMS[form]: c).apply(layer, x, weights, ids), ref)
    silu = fused_experts(x, layer.experts.w13, layer.experts.w2, weights, ids, FORMS[form])
    assert (silu - ref).abs().max() > 1e-3  # the activation is not SiLU's


def test_unknown_activation_is_refused():
    _, layer = gemma_moe()
    x, w, ids = torch.zeros(1, H, device=DEV), torch.ones(1, 1, device=DEV), \
        torch.zeros(1, 1, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="activation 'relu' is not one of"):
        fused_experts(x, layer.experts.w13, layer.experts.w2, w, ids, activation="relu")
    layer.experts.activation = "relu"
    with pytest.raises(ValueError, match="not 'relu'"):
        TritonMoE().apply(layer, x, w, ids)


@pytest.mark.parametrize("n", [3, 17])
def test_the_models_moe_takes_the_kernels(n):
    """The model's router and experts: the `triton` ops table's method against the
    reference's (the method the model builds for each table)."""
    router, layer = gemma_moe(seed=n + 1)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(n)).to(DEV)
    x[0] = 0.0  # a zero row: equal router logits, ties to the lowest experts
    methods = {name: moe_method(get_ops(name), GELU) for name in ("reference", "triton")}
    assert isinstance(methods["triton"], TritonMoE)
    rw, rids = router(x, methods["reference"])
    w, ids = router(x, methods["triton"])
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)
    assert ids[0].tolist() == list(range(K))
    check(methods["triton"].apply(layer, x, w, ids),
          methods["reference"].apply(layer, x, rw, rids))
    with torch.device("meta"):
        built = DiffusionGemmaLayer(gemma_config(E, K, H, INTER), 0, get_ops("triton"))
    assert isinstance(built.method, TritonMoE)


REAL = dict(experts=128, top_k=8, hidden=2816, inter=704)  # DiffusionGemma-26B-A4B


@pytest.mark.gpu
@pytest.mark.parametrize("n", [256, 5])
def test_real_shape_gpu(n):
    router, layer = gemma_moe(**REAL, dtype=torch.bfloat16, seed=n)
    x = torch.randn(n, REAL["hidden"], device=DEV, dtype=torch.bfloat16)
    rw, rids = router(x, ReferenceMoE())
    w, ids = router(x, TritonMoE())
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)
    check(TritonMoE().apply(layer, x, w, ids), ReferenceMoE().apply(layer, x, rw, rids))


@pytest.mark.gpu
def test_graph_replay_bit_identical_gpu():
    router, layer = gemma_moe(**REAL, dtype=torch.bfloat16, seed=3)
    method = TritonMoE()

    def moe(x):
        return method.apply(layer, x, *router(x, method))

    assert_replay_matches_eager(moe, (256, REAL["hidden"]))
