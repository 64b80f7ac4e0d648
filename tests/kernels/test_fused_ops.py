"""Fused small-op kernels against the reference ops they replace (`dlrt.ops.reference`).

RMSNorm (+ residual add), per-head q/k RMSNorm + RoPE (full or partial) + paged K/V write,
SiLU-and-mul. Fresh
random inputs, awkward shapes (odd rows, hidden sizes that are not powers of two, GQA, pages
that do not divide the positions, a shuffled page table). Runs under TRITON_INTERPRET=1 on the
CPU and natively on the GPU. Tolerance: fp32 relative error < 1e-5 (1e-4 for SiLU, whose exp
differs by ulps); bf16 at most one bf16 ulp apart (the reference rounds at the same points, the
fp32 statistics may differ in the last bits).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.kernels.activation import silu_mul  # noqa: E402
from dlrt.kernels.rms_norm import rms_norm  # noqa: E402
from dlrt.kernels.rope import qk_norm_rope_write  # noqa: E402
from dlrt.kernels.skinny_gemm import GemmConfig, gemv, skinny_gemm  # noqa: E402
from dlrt.layers.rotary import RotaryEmbedding  # noqa: E402
from dlrt.ops import reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])


def close(out: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype == torch.bfloat16:
        # one bf16 ulp: 2^-7 relative
        torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-3)
    else:
        err = (out.double() - ref.double()).abs().max() / ref.double().abs().max()
        assert err < rel, float(err)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,h", [(1, 64), (5, 96), (4, 2048), (13, 200)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(n, h, with_residual, dtype):
    gen = torch.Generator().manual_seed(n * h)
    x = torch.randn(n, h, generator=gen).to(DEV, dtype) * 3
    res = torch.randn(n, h, generator=gen).to(DEV, dtype)
    weight = (torch.rand(h, generator=gen) + 0.5).to(DEV, dtype)
    if with_residual:
        ref, ref_res = reference.add_rms_norm(x, res, weight, 1e-6)
        kernel_res = res.clone()
        out = rms_norm(x, weight, 1e-6, kernel_res)
        close(kernel_res, ref_res)
    else:
        ref, out = reference.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6)
    close(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,i", [(1, 8), (4, 1000), (7, 3072)])
def test_silu_mul(n, i, dtype):
    gen = torch.Generator().manual_seed(i)
    gu = (torch.randn(n, 2 * i, generator=gen) * 4).to(DEV, dtype)
    g, u = gu.chunk(2, dim=-1)
    close(silu_mul(gu), torch.nn.functional.silu(g) * u, rel=1e-4)
    close(silu_mul(gu), reference.silu_and_mul(gu), rel=1e-4)


CASES = [  # n, hq, hkv, d, page, first position, norm, full precision, rotary dims (None: d)
    (4, 4, 2, 16, 16, 37, True, False, None),
    (5, 8, 1, 32, 8, 0, True, False, None),
    (3, 4, 4, 64, 4, 1001, False, True, None),
    (1, 2, 1, 128, 16, 7, True, False, None),
    (9, 4, 4, 16, 16, 250, False, True, None),
    # partial RoPE (LLaDA2: 64 of 128; the tiny preset: 16 of 32); 96 pass-through dims (not a
    # power of two); one rotated pair; without norm; in full precision
    (5, 4, 2, 128, 16, 37, True, False, 64),
    (4, 4, 2, 32, 8, 3, True, False, 16),
    (3, 2, 1, 128, 16, 600, True, False, 32),
    (2, 4, 4, 16, 4, 9, True, False, 2),
    (6, 4, 2, 64, 16, 100, False, False, 32),
    (3, 4, 4, 64, 8, 21, False, True, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_qk_norm_rope_write(case, dtype):
    n, hq, hkv, d, page, first, norm, fp32_rope, rot = case
    gen = torch.Generator().manual_seed(n * 31 + d)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).to(DEV, dtype)
    positions = torch.arange(first, first + n, device=DEV)
    pages = (first + n) // page + 3
    page_table = torch.randperm(pages, generator=gen).to(DEV, torch.int32)
    k_cache = torch.zeros(pages, page, hkv, d, dtype=dtype, device=DEV)
    v_cache = torch.zeros_like(k_cache)
    rotary = RotaryEmbedding(d, 10000.0 if fp32_rope else 1e6, full_precision=fp32_rope,
                             rotary_dim=rot).to(DEV)
    cos, sin = rotary.cos_sin(positions)
    assert cos.shape == (n, (rot or d) // 2)
    q_w = k_w = None
    if norm:
        q_w = (torch.rand(d, generator=gen) + 0.5).to(DEV, dtype)
        k_w = (torch.rand(d, generator=gen) + 0.5).to(DEV, dtype)

    q = qk_norm_rope_write(qkv, hq, hkv, d, q_w, k_w, 1e-6, cos, sin, positions, k_cache,
                           v_cache, page_table, fp32_rope)

    rq, rk, rv = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    rq, rk, rv = rq.reshape(n, hq, d), rk.reshape(n, hkv, d), rv.reshape(n, hkv, d)
    if norm:
        rq, rk = reference.rms_norm(rq, q_w, 1e-6), reference.rms_norm(rk, k_w, 1e-6)
    rq = reference.rope_rotate(rq, cos, sin, fp32_rope)
    rk = reference.rope_rotate(rk, cos, sin, fp32_rope)
    close(q, rq)
    # the reference op writes the same cache (`dlrt.ops.reference.qk_norm_rope_write`)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    ref_q = reference.qk_norm_rope_write(qkv, hq, hkv, d, q_w, k_w, 1e-6, cos, sin, positions,
                                         ref_k, ref_v, page_table, fp32_rope)
    close(q, ref_q)
    close(k_cache, ref_k)
    assert torch.equal(v_cache, ref_v)
    slots = page_table[positions // page].long() * page + positions % page
    close(k_cache.view(-1, hkv, d)[slots], rk)
    assert torch.equal(v_cache.view(-1, hkv, d)[slots], rv)
    untouched = torch.ones(pages * page, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert not k_cache.view(-1, hkv, d)[untouched].any()
    assert not v_cache.view(-1, hkv, d)[untouched].any()
    if rot is not None:  # partial: the pass-through dims are the (normalised) inputs
        pq = qkv[:, :hq * d].reshape(n, hq, d)
        if norm:
            pq = reference.rms_norm(pq, q_w, 1e-6)
        close(q[..., rot:].contiguous(), pq[..., rot:].contiguous())
        assert (q[..., :rot] - pq[..., :rot]).abs().max() > 1e-2


def test_partial_rope_is_transformers_partial_rotary_factor():
    """inv_freq over the rotated dims, as transformers' default rope with
    partial_rotary_factor (LLaDA2: 64 of 128, theta 600000), and RoPE of only those dims."""
    rotary = RotaryEmbedding(128, 600000.0, rotary_dim=64)
    want = 1.0 / 600000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64)
    assert torch.equal(rotary.inv_freq, want)
    x = torch.randn(3, 2, 128)
    cos, sin = rotary.cos_sin(torch.tensor([0, 5, 70]))
    y = reference.rope_rotate(x, cos, sin, False)
    assert torch.equal(y[..., 64:], x[..., 64:])
    full = reference.rope_rotate(x[..., :64], cos, sin, False)
    assert torch.equal(y[..., :64], full)
    assert torch.equal(y[0], x[0])  # position 0: no rotation


def test_shape_errors():
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(torch.zeros(4, 6, device=DEV).t(), torch.ones(4, device=DEV), 1e-6)
    with pytest.raises(ValueError, match=r"\[N, 2I\]"):
        silu_mul(torch.zeros(2, 5, device=DEV))
    with pytest.raises(ValueError, match="qkv"):
        qk_norm_rope_write(torch.zeros(2, 10, device=DEV), 2, 1, 4, None, None, 1e-6,
                           None, None, None, None, None, None, False)
    cos = torch.zeros(2, 3, device=DEV)  # R = 6: R/2 not a power of two
    with pytest.raises(ValueError, match="R/2"):
        qk_norm_rope_write(torch.zeros(2, 32, device=DEV), 2, 1, 8, None, None, 1e-6,
                           cos, cos, None, None, None, None, False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,v", [(1, 7), (4, 1000), (3, 5000), (5, 40000)])
def test_greedy_candidates(n, v, dtype):
    from dlrt.kernels.greedy import greedy_candidates

    gen = torch.Generator().manual_seed(n + v)
    logits = (torch.randn(n, v, generator=gen) * 3).to(DEV, dtype)
    logits[0, v // 3] = logits[0, v - 1] = logits[0].max() + 1  # a tie: the first id wins
    ids, conf = greedy_candidates(logits)
    ref_conf, ref_ids = torch.softmax(logits.float(), dim=-1).max(dim=-1)
    assert torch.equal(ids, ref_ids) and ids[0] == v // 3
    err = ((conf - ref_conf).abs() / ref_conf).max()
    assert err < 1e-5, float(err)


GEMM_CASES = [  # m, n, k, config: "dot" with split-K, then the GEMV ("fma", M <= 4)
    (1, 48, 256, GemmConfig(16, 128, 1, stages=2)),
    (4, 100, 512, GemmConfig(32, 128, 2, stages=2)),
    (16, 64, 1024, GemmConfig(64, 256, 4, stages=2)),
    (7, 33, 384, GemmConfig(16, 128, 3, stages=2)),
    # GEMV: N not a multiple of block_n; one and several K tiles; 1-4 tiles ahead (more
    # than the K tiles too)
    (4, 100, 512, GemmConfig(8, 128, 1, stages=1, kind="fma")),
    (4, 100, 512, GemmConfig(8, 128, 1, stages=2, kind="fma")),
    (4, 100, 512, GemmConfig(8, 64, 1, stages=3, kind="fma")),
    (3, 70, 256, GemmConfig(16, 128, 1, stages=4, kind="fma")),
    (4, 70, 1024, GemmConfig(8, 64, 1, stages=4, kind="fma")),  # 16 tiles, 4 ahead
    (1, 37, 256, GemmConfig(16, 256, 1, stages=2, kind="fma")),
    (3, 64, 1024, GemmConfig(4, 256, 1, stages=1, kind="fma")),
    (2, 129, 384, GemmConfig(8, 128, 1, stages=2, kind="fma")),
    (4, 40, 256, GemmConfig(8, 128, 1, stages=2, kind="fma")),
    # tiles whose warps all lie along K: x read as one [1, BLOCK_K] row (GemmConfig.x_row)
    (4, 33, 512, GemmConfig(4, 256, 1, stages=2, warps=1, kind="fma")),
    (3, 20, 512, GemmConfig(8, 512, 1, stages=1, warps=2, kind="fma")),
    (4, 40, 1024, GemmConfig(4, 512, 1, stages=4, warps=2, kind="fma")),
    (2, 30, 1024, GemmConfig(8, 64, 1, stages=4, kind="fma")),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GEMM_CASES, ids=[str(c[:3]) + c[3].kind + str(c[3].stages)
                                                  for c in GEMM_CASES])
def test_skinny_gemm(case, dtype):
    """skinny_gemm on fresh random [m, k] x [n, k]^T against float64, twice (deterministic)."""
    m, n, k, cfg = case
    gen = torch.Generator().manual_seed(m * n + k + cfg.stages)
    x = torch.randn(m, k, generator=gen).to(DEV, dtype)
    w = torch.randn(n, k, generator=gen).to(DEV, dtype)
    out = skinny_gemm(x, w, cfg)
    ref = (x.double() @ w.double().T)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert out.shape == (m, n) and err < tol, err
    assert torch.equal(out, skinny_gemm(x, w, cfg))
    assert skinny_gemm(x[:0], w, cfg).shape == (0, n)  # no rows: nothing read or written


def test_gemv_rejects_what_does_not_fit():
    cfg = GemmConfig(8, 64, 1, stages=2, kind="fma")
    x, w = torch.zeros(2, 64, device=DEV), torch.zeros(8, 64, device=DEV)
    with pytest.raises(ValueError, match=r"\[M<=4, K\]"):
        gemv(torch.zeros(2, 128, device=DEV), w, cfg)  # K differs
    with pytest.raises(ValueError, match="contiguous"):
        gemv(torch.zeros(64, 2, device=DEV).t(), w, cfg)
    with pytest.raises(ValueError, match="'fma'"):
        gemv(x, w, GemmConfig(16, 64, 1))
    with pytest.raises(ValueError, match="float64"):
        gemv(x, w.double(), cfg)
    with pytest.raises(ValueError, match="does not fit"):  # K = 0, a tile not a power of two
        gemv(torch.zeros(2, 0, device=DEV), torch.zeros(8, 0, device=DEV), cfg)
    with pytest.raises(ValueError, match="does not fit"):
        gemv(torch.zeros(2, 96, device=DEV), torch.zeros(8, 96, device=DEV),
             GemmConfig(8, 96, 1, stages=1, kind="fma"))
    with pytest.raises(ValueError, match="must be contiguous"):  # ranks
        gemv(torch.zeros(64, device=DEV), w, cfg)
    with pytest.raises(ValueError, match="must be"):
        skinny_gemm(torch.zeros(64, device=DEV), w, cfg)


def test_skinny_gemv_rows_and_linear_fallback(monkeypatch):
    from dlrt.layers.linear import Linear
    from dlrt.layers.quant.unquantized import SkinnyGemmLinear

    cfg = GemmConfig(8, 64, 1, stages=1, kind="fma")
    with pytest.raises(ValueError, match="M<=4"):
        skinny_gemm(torch.zeros(5, 64, device=DEV), torch.zeros(8, 64, device=DEV), cfg)
    with pytest.raises(ValueError, match="does not fit"):
        skinny_gemm(torch.zeros(2, 64, device=DEV), torch.zeros(8, 64, device=DEV),
                    GemmConfig(8, 64, 2, stages=1, kind="fma"))
    # more rows than the GEMV serves: the method takes F.linear for that call
    layer = Linear(64, 8).to(DEV)
    w = layer.weight.detach().normal_()  # the layer's own weight is uninitialised
    layer.method = SkinnyGemmLinear(cfg)
    calls = []
    import dlrt.kernels.skinny_gemm as sg
    monkeypatch.setattr(sg, "skinny_gemm", lambda *a: calls.append(a) or torch.zeros(4, 8))
    x8 = torch.randn(8, 64, device=DEV)
    with torch.no_grad():
        torch.testing.assert_close(layer(x8), x8 @ w.T)
        layer(torch.randn(4, 64, device=DEV))
    assert not calls[1:] and len(calls) == 1 and calls[0][0].shape == (4, 64)


def test_skinny_gemm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="M<=16"):
        skinny_gemm(torch.zeros(17, 64, device=DEV), torch.zeros(8, 64, device=DEV),
                    GemmConfig(16, 64, 1))
    with pytest.raises(ValueError, match="does not fit"):
        skinny_gemm(torch.zeros(2, 96, device=DEV), torch.zeros(8, 96, device=DEV),
                    GemmConfig(16, 64, 1))


def test_gemm_candidates_fit_and_offer_the_gemv_for_few_rows():
    from dlrt.tuning.linear import candidates

    for n, k in ((4096, 2048), (2048, 6144), (151936, 4096), (100, 512)):
        four, eight = candidates(n, k, 132, rows=4), candidates(n, k, 132, rows=8)
        assert four and all(c.fits(n, k) for c in four + eight)
        assert {c.kind for c in four} == {"dot", "fma"}
        assert {c.kind for c in eight} == {"dot"}
