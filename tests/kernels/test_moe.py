"""The MoE kernels against the PyTorch reference (`dlrt.layers.moe.reference`).

Routing kernel == `route` (exact ids, weights within 1e-6) for both rules, random and tied
logits; the pair alignment table; the fused method == `ReferenceMoE.apply` in both forms
(rows / GEMV and tiles / grouped GEMM) on fresh random inputs and the awkward cases (every row
to one expert, all pairs distinct, k = 1, ties, zero rows, N = 1). Runs under TRITON_INTERPRET=1
on the CPU at tiny shapes (the interpreter rounds bf16 by truncation: bf16 is checked on the
GPU). Tolerances: fp32 max error < 1e-5 of the output's max; bf16 within 2 bf16 ulps of the
output's scale (the reference rounds at the same points; fp32 sums may order differently).
GPU: real SDAR-30B-A3B / LLaDA2.0-mini shapes, and a CUDA-graph replay bit-identical to eager.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import assert_replay_matches_eager  # noqa: E402

from dlrt.kernels.moe import MoEConfig, fused_experts, moe_config, moe_form  # noqa: E402
from dlrt.kernels.moe_align import align_pairs, max_tiles  # noqa: E402
from dlrt.kernels.moe_route import route_topk  # noqa: E402
from dlrt.layers.moe import FusedMoE  # noqa: E402
from dlrt.layers.moe.base import RouterSpec  # noqa: E402
from dlrt.layers.moe.reference import ReferenceMoE, route  # noqa: E402
from dlrt.layers.moe.triton import TritonMoE  # noqa: E402
from dlrt.ops import get_ops  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])
E, K, H, INTER = 8, 2, 64, 32  # tiny layer for the interpreter
# forced forms at tiny shapes: rows (2 pairs per pass: passes > 1 get exercised) and tiles
FORMS = {"rows": MoEConfig("rows", rows=2, up_n=16, up_k=32, down_n=16, down_k=16),
         "tiles": MoEConfig("tiles", block_m=16, up_n=16, up_k=32, down_n=32, down_k=16)}
SPECS = {"softmax": RouterSpec("softmax", E, K),
         "sigmoid": RouterSpec("sigmoid", E, K, n_group=4, topk_group=2, scaling=2.5)}


def route_both(spec: RouterSpec, logits: torch.Tensor, bias: torch.Tensor | None):
    got = route_topk(logits, spec.top_k, spec.scoring, bias, spec.renormalize, spec.n_group,
                     spec.topk_group, spec.scaling)
    return got, route(spec, logits, bias if spec.scoring == "sigmoid" else None)


ROUTE_CASES = [RouterSpec("softmax", 8, 2), RouterSpec("softmax", 12, 1),
               RouterSpec("softmax", 16, 4, renormalize=False),
               RouterSpec("sigmoid", 8, 1, scaling=2.5),
               RouterSpec("sigmoid", 16, 4, n_group=4, topk_group=2, scaling=2.5),
               RouterSpec("sigmoid", 24, 3, n_group=3, topk_group=2, renormalize=False),
               RouterSpec("sigmoid", 8, 2, n_group=8, topk_group=3)]


@pytest.mark.parametrize("spec", ROUTE_CASES, ids=lambda s: f"{s.scoring}-E{s.num_experts}-"
                         f"k{s.top_k}-g{s.n_group}")
@pytest.mark.parametrize("n", [1, 7])
def test_route_kernel_matches_reference(spec, n):
    gen = torch.Generator().manual_seed(spec.num_experts * 10 + n)
    logits = torch.randn(n, spec.num_experts, generator=gen) * 2
    # experts e and e + E/2 share a bias: ties (of experts and of groups) under equal logits
    bias = (torch.randn(spec.num_experts // 2, generator=gen) * 0.3).repeat(2)
    # ties: a row of equal logits, and a row repeating one value in several places
    logits[0, :] = 0.25
    if n > 1:
        logits[1, ::3] = logits[1].max()
    (w, ids), (rw, rids) = route_both(spec, logits.to(DEV), bias.to(DEV))
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(ids, rids), (ids, rids)
    torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)


def test_route_kernel_bias_ties_and_groups():
    # equal group sums (0.75 + 0.75 == 1.0 + 0.5): the lower group wins; bias picks, not weighs
    spec = RouterSpec("sigmoid", 6, 2, n_group=3, topk_group=1)
    bias = torch.tensor([0.0, 0.0, 0.25, 0.25, 0.5, 0.0], device=DEV)
    (w, ids), (rw, rids) = route_both(spec, torch.zeros(2, 6, device=DEV), bias)
    assert ids.tolist() == rids.tolist() == [[2, 3], [2, 3]]
    assert torch.equal(w, rw) and w.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_route_kernel_bf16_softmax_logits():
    spec = RouterSpec("softmax", 16, 4)
    logits = (torch.randn(5, 16, generator=torch.Generator().manual_seed(3)) * 3).to(DEV)
    logits = logits.to(torch.float32 if DEV == "cpu" else torch.bfloat16)
    (w, ids), (rw, rids) = route_both(spec, logits, None)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n,k,e,r", [(5, 2, 8, 3), (7, 3, 16, 64), (1, 1, 4, 1), (40, 1, 8, 4),
                                     (700, 2, 8, 64)])  # 1400 pairs: two sorted chunks
def test_align_pairs(n, k, e, r):
    gen = torch.Generator().manual_seed(n + k + e)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
    if n == 40:
        ids[:] = 3  # every pair to one expert: ten tiles
    nk, t = n * k, max_tiles(n * k, e, r)
    table = align_pairs(ids.to(DEV), e, r).cpu().tolist()
    flat = ids.reshape(-1).tolist()
    pairs = table[1 + 3 * t: 1 + 3 * t + nk]
    assert pairs == sorted(range(nk), key=lambda p: (flat[p], p))
    covered = []
    for tile in range(table[0]):
        expert, first, count = table[1 + 3 * tile: 4 + 3 * tile]
        assert 0 < count <= r and all(flat[p] == expert for p in pairs[first:first + count])
        covered += pairs[first:first + count]
    assert covered == pairs


def make_layer(spec: RouterSpec, dtype=torch.float32, hidden=H, inter=INTER, seed=0) -> FusedMoE:
    gen = torch.Generator().manual_seed(seed)
    layer = FusedMoE(hidden, inter, spec, get_ops("triton"))
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 1.0 if name.startswith("gate") else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    layer = layer.to(DEV, dtype).requires_grad_(False)
    if spec.scoring == "sigmoid":
        layer.gate.float()
    return layer


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = ref.float().abs().max().clamp_min(1e-6)
    err = float((out.float() - ref.float()).abs().max() / scale)
    assert err < (2 * 2**-8 if out.dtype == torch.bfloat16 else 1e-5), err


def run_forms(layer, x, weights, ids):
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    for form, cfg in FORMS.items():
        out = TritonMoE(lambda *_, c=cfg: c).apply(layer, x, weights, ids)
        check(out, ref)
        assert form
    return ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scoring", list(SPECS))
@pytest.mark.parametrize("n", [1, 5, 19])
def test_fused_matches_reference(n, scoring, dtype):
    layer = make_layer(SPECS[scoring], dtype, seed=n)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(n)).to(DEV, dtype)
    weights, ids = layer.method.route(layer, x)
    rw, rids = ReferenceMoE().route(layer, x)
    assert torch.equal(ids, rids)
    run_forms(layer, x, weights, ids)
    check(layer(x), ReferenceMoE().apply(layer, x, rw, rids))  # the layer's own choice


def test_awkward_routings():
    layer = make_layer(RouterSpec("softmax", E, K), seed=1)
    gen = torch.Generator().manual_seed(9)
    n = 9
    x = torch.randn(n, H, generator=gen).to(DEV)
    w = torch.rand(n, K, generator=gen).to(DEV)
    # every pair of every row to the same two experts (a tile of nine rows each)
    run_forms(layer, x, w, torch.tensor([[5, 2]] * n, device=DEV))
    # all pairs distinct experts (N*k == E)
    run_forms(layer, x[:4], w[:4], torch.randperm(E, generator=gen).view(4, K).to(DEV))
    # k = 1, every row to one expert
    run_forms(layer, x, w[:, :1], torch.full((n, 1), 7, device=DEV))
    # repeated ids within a row (not a router's output, but the sum is still defined)
    run_forms(layer, x[:3], w[:3], torch.tensor([[1, 1], [1, 1], [0, 1]], device=DEV))


def test_ties_padding_and_one_row():
    layer = make_layer(SPECS["sigmoid"], seed=2)
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(4)).to(DEV)
    x[1] = 0.0  # padding rows: equal router logits, ties to the lowest experts
    x[4] = 0.0
    weights, ids = layer.method.route(layer, x)
    assert torch.equal(ids, ReferenceMoE().route(layer, x)[1])
    run_forms(layer, x, weights, ids)
    out = TritonMoE(lambda *_: FORMS["tiles"]).apply(layer, x, weights, ids)
    assert not out[1].any() and not out[4].any()  # zero rows give zero outputs
    run_forms(layer, x[:1], weights[:1], ids[:1])
    assert TritonMoE().apply(layer, x[:0], weights[:0], ids[:0]).shape == (0, H)


def test_sizes_off_the_blocks():
    """H = 48, I = 24: column blocks with tails (clamped loads, masked stores), K steps of 16
    and 8; the tiles form needs multiples of 16, so the layer takes the rows form."""
    layer = make_layer(SPECS["softmax"], hidden=48, inter=24, seed=6)
    x = torch.randn(7, 48, generator=torch.Generator().manual_seed(6)).to(DEV)
    weights, ids = layer.method.route(layer, x)
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    assert moe_config(7, K, E, 48, 24).form == "rows"
    check(layer.method.apply(layer, x, weights, ids), ref)
    cfg = MoEConfig("rows", rows=4, up_n=16, up_k=16, down_n=32, down_k=8)
    check(fused_experts(x, layer.experts.w13, layer.experts.w2, weights, ids, cfg), ref)


def test_deterministic_and_form_rule():
    layer = make_layer(SPECS["softmax"], seed=3)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(5)).to(DEV)
    weights, ids = layer.method.route(layer, x)
    for cfg in FORMS.values():
        a = fused_experts(x, layer.experts.w13, layer.experts.w2, weights, ids, cfg)
        b = fused_experts(x, layer.experts.w13, layer.experts.w2, weights, ids, cfg)
        assert torch.equal(a, b)
    # a pure function of the static shape: decode blocks take rows, canvases / prefill tiles
    assert moe_form(1, 8, 128) == moe_form(4, 2, 8) == "rows"
    assert moe_form(4, 8, 128) == moe_form(32, 8, 256) == moe_form(1024, 8, 128) == "tiles"
    assert moe_config(4, 8, 128, 2048, 768).block_m == 16
    assert moe_config(1024, 8, 128, 2048, 768).block_m == 64
    assert moe_config(300, 2, 4, 48, 24).form == "rows"  # no tl.dot tiles for 24


GPU_SHAPES = [  # n, E, k, H, I, router
    (4, 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
    (64, 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
    (32, 256, 8, 2048, 512, RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4,
                                       scaling=2.5)),
    (300, 256, 8, 2048, 512, RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4,
                                        scaling=2.5)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_SHAPES, ids=lambda c: f"n{c[0]}-E{c[1]}")
def test_real_shapes_gpu(case):
    n, e, k, h, i, spec = case
    layer = make_layer(spec, torch.bfloat16, h, i, seed=n)
    x = torch.randn(n, h, device=DEV, dtype=torch.bfloat16)
    weights, ids = layer.method.route(layer, x)
    rw, rids = ReferenceMoE().route(layer, x)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(weights, rw, rtol=0, atol=1e-6)
    check(layer.method.apply(layer, x, weights, ids), ReferenceMoE().apply(layer, x, rw, rids))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4, 64])
def test_graph_replay_bit_identical_gpu(n):
    layer = make_layer(RouterSpec("softmax", 128, 8), torch.bfloat16, 2048, 768, seed=7)
    method = layer.method

    def moe(x):
        return method.apply(layer, x, *method.route(layer, x))

    assert_replay_matches_eager(moe, (n, 2048))


@pytest.mark.gpu
def test_peak_memory_does_not_depend_on_the_experts_touched_gpu():
    """All 32 pairs to one expert, or to 32 distinct experts: the same peak memory."""
    n, k = 4, 8
    layer = make_layer(RouterSpec("softmax", 128, k), torch.bfloat16, 2048, 768, seed=3)
    x = torch.randn(n, 2048, device=DEV, dtype=torch.bfloat16)
    weights = torch.full((n, k), 1.0 / k, device=DEV)
    cases = {"one expert": torch.zeros(n, k, dtype=torch.int64, device=DEV),
             "all distinct": torch.arange(n * k, device=DEV).view(n, k)}
    peaks = {}
    for name, ids in cases.items():
        layer.method.apply(layer, x, weights, ids)  # compile first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        layer.method.apply(layer, x, weights, ids)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
    assert peaks["one expert"] == peaks["all distinct"], peaks
