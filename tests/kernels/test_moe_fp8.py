"""The fused MoE kernels on FP8 experts (`dlrt.kernels.moe_fp8`) against the PyTorch reference.

The reference is `ReferenceMoE.apply` on the same FP8 layer, which dequantises the experts
(w * scale_inv per 128 x 128 block, fp32) as it reads them. Under TRITON_INTERPRET=1 on the CPU
with fp32 activations (the interpreter's bf16 dot is unreliable) at tiny block-aligned shapes
(H = 256, I = 128: two block rows of w13 / w2 per expert; E = 8, k = 2), the weights scaled
per 128 x 128 block so that every block has its own scale. Tolerance: max error < 1e-5 of the
output's max in fp32 (the kernels differ from the reference in fp32 summation order and, in the
tiles form, apply the scale to a step's partial sum). bf16 on the GPU: within 2 bf16 ulps of
the output's scale. Both forms, the awkward routings (every row to one expert, k = 1); the row
layout (I not a multiple of 128: a scale row per weight row) and compressed-tensors'
per-channel scales read as FP8 too, for SiLU and GELU experts. GPU: SDAR-30B-A3B,
LLaDA2.0-mini and DiffusionGemma (I = 704, GELU) shapes in bf16, and a CUDA-graph replay
bit-identical to eager.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernel_checks import (  # noqa: E402
    assert_replay_matches_eager,
    body,
    compile_sm90,
    ptx_folder,
)

from dlrt.kernels.e4m3 import f16_rows  # noqa: E402
from dlrt.kernels.moe import MoEConfig, fused_experts  # noqa: E402
from dlrt.kernels.moe_fp8 import _fp8_dot, unroll_for  # noqa: E402
from dlrt.layers.moe import FusedMoE  # noqa: E402
from dlrt.layers.moe.base import RouterSpec  # noqa: E402
from dlrt.layers.moe.reference import ReferenceMoE  # noqa: E402
from dlrt.layers.moe.triton import TritonMoE, fp8_blocks  # noqa: E402
from dlrt.layers.quant.compressed_tensors import CT_FP8_FORMAT, CtFp8Format  # noqa: E402
from dlrt.layers.quant.convert import quantize_experts  # noqa: E402
from dlrt.layers.quant.fp8 import FP8_FORMAT, FP8_ROWS_FORMAT  # noqa: E402
from dlrt.ops import get_ops  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E, K, H, INTER = 8, 2, 256, 128
# forced forms: rows (2 pairs per pass), tiles, and wide tiles (a program spans two scale rows
# of w2; K steps of 256 capped at 128)
FORMS = {"rows": MoEConfig("rows", rows=2, up_n=32, up_k=128, down_n=64, down_k=64),
         "tiles": MoEConfig("tiles", block_m=16, up_n=32, up_k=64, down_n=64, down_k=128),
         "wide": MoEConfig("tiles", block_m=16, up_n=128, up_k=256, down_n=256, down_k=128)}


def make_fp8_layer(spec: RouterSpec, dtype=torch.float32, hidden=H, inter=INTER,
                   seed=0, fmt=FP8_FORMAT) -> FusedMoE:
    """A layer with random weights, every 128 x 128 expert block multiplied by its own factor
    (0.25 to 4), the experts then quantised to `fmt` (FP8: the layout that fits I)."""
    gen = torch.Generator().manual_seed(seed)
    layer = FusedMoE(hidden, inter, spec, get_ops("triton"))
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 1.0 if name.startswith("gate") else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
        for p in (layer.experts.w13, layer.experts.w2):
            e, n, k = p.shape
            f = 0.25 * 16 ** torch.rand(e, -(-n // 128), -(-k // 128), generator=gen)
            p.mul_(f.repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)[:, :, :k])
    layer = layer.to(DEV, dtype).requires_grad_(False)  # before quantising: FP8 is a float
    quantize_experts(layer.experts, fmt)
    if spec.scoring == "sigmoid":
        layer.gate.float()
    return layer


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = ref.float().abs().max().clamp_min(1e-6)
    err = float((out.float() - ref.float()).abs().max() / scale)
    assert err < (2 * 2**-8 if out.dtype == torch.bfloat16 else 1e-5), err


def no_dequantise(layer):
    """Fail the call if the experts are dequantised (the kernels must read FP8)."""
    def fail(*_):
        raise AssertionError("FP8 experts were dequantised")
    layer.experts.expert_weight = fail


def run_forms(layer, x, weights, ids):
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    no_dequantise(layer)
    try:
        for cfg in FORMS.values():
            check(TritonMoE(lambda *_, c=cfg: c).apply(layer, x, weights, ids), ref)
    finally:
        del layer.experts.expert_weight
    return ref


def test_layout_is_blocks():
    ex = make_fp8_layer(RouterSpec("softmax", E, K)).experts
    assert ex.quant_format is FP8_FORMAT and fp8_blocks(ex)
    assert ex.w13.dtype == torch.float8_e4m3fn and ex.w2.dtype == torch.float8_e4m3fn
    assert ex.w13_weight_scale_inv.shape == (E, 2, 2)
    assert ex.w2_weight_scale_inv.shape == (E, 2, 1)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("n", [1, 6])
def test_fp8_fused_matches_reference(n, scoring):
    spec = RouterSpec("softmax", E, K) if scoring == "softmax" else \
        RouterSpec("sigmoid", E, K, n_group=4, topk_group=2, scaling=2.5)
    layer = make_fp8_layer(spec, seed=n)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(n)).to(DEV)
    weights, ids = layer.method.route(layer, x)
    ref = run_forms(layer, x, weights, ids)
    check(layer.method.apply(layer, x, weights, ids), ref)  # the layer's own config


def test_fp8_awkward_routings():
    layer = make_fp8_layer(RouterSpec("softmax", E, K), seed=1)
    gen = torch.Generator().manual_seed(9)
    n = 9
    x = torch.randn(n, H, generator=gen).to(DEV)
    w = torch.rand(n, K, generator=gen).to(DEV)
    run_forms(layer, x, w, torch.tensor([[5, 2]] * n, device=DEV))  # all rows to two experts
    run_forms(layer, x, w[:, :1], torch.full((n, 1), 7, device=DEV))  # k = 1, one expert
    run_forms(layer, x[:4], w[:4], torch.randperm(E, generator=gen).view(4, K).to(DEV))
    x[3] = 0.0
    ids = torch.tensor([[0, 1]] * n, device=DEV)
    out = TritonMoE(lambda *_: FORMS["tiles"]).apply(layer, x, w, ids)
    assert not out[3].any()


# forced forms for H = 64, I = 160 (K steps dividing both)
ROW_FORMS = {"rows": MoEConfig("rows", rows=2, up_n=32, up_k=64, down_n=32, down_k=32),
             "tiles": MoEConfig("tiles", block_m=16, up_n=32, up_k=64, down_n=32, down_k=32)}


@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh"])
def test_row_layout_is_read_as_fp8(activation):
    """I = 160 (the gate / up boundary off the 128-row blocks, as DiffusionGemma's I = 704):
    scales held per weight row, each part's two stored scale rows repeated on their rows; both
    forms read the experts as FP8 (never dequantised) and equal the reference, for SiLU and
    GELU experts; scales in neither layout are refused."""
    layer = make_fp8_layer(RouterSpec("softmax", E, K), hidden=64, inter=160, seed=4)
    ex = layer.experts
    ex.activation = activation
    assert ex.quant_format is FP8_ROWS_FORMAT and fp8_blocks(ex)
    assert ex.w13_weight_scale_inv.shape == (E, 320, 1)
    assert ex.w2_weight_scale_inv.shape == (E, 64, 2)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4)).to(DEV)
    weights, ids = layer.method.route(layer, x)
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    no_dequantise(layer)
    try:
        for cfg in ROW_FORMS.values():
            check(TritonMoE(lambda *_, c=cfg: c).apply(layer, x, weights, ids), ref)
        check(layer.method.apply(layer, x, weights, ids), ref)  # the layer's own config
    finally:
        del layer.experts.expert_weight
    with pytest.raises(ValueError, match="fp8.*block rows .*a row per weight row or per channel"):
        fused_experts(x, ex.w13, ex.w2, weights, ids, w13_scale=ex.w13_weight_scale_inv[:, 1:],
                      w2_scale=ex.w2_weight_scale_inv)


@pytest.mark.parametrize("fmt,inter,activation", [
    (CT_FP8_FORMAT, 160, "gelu_pytorch_tanh"), (CtFp8Format("tensor"), 128, "silu")],
    ids=["channel-gelu", "tensor-silu"])
def test_compressed_tensors_experts_are_read_as_fp8(fmt, inter, activation):
    """compressed-tensors FP8 experts: a scale per weight row ([E, 2I, 1] / [E, H, 1]; a
    per-tensor scale repeated on its part's rows) for the whole of K, whatever I; both forms
    read them as FP8 and equal the reference."""
    layer = make_fp8_layer(RouterSpec("softmax", E, K), hidden=H, inter=inter, seed=5,
                           fmt=fmt)
    ex = layer.experts
    ex.activation = activation
    assert fp8_blocks(ex) and ex.w13_weight_scale.shape == (E, 2 * inter, 1)
    assert ex.w2_weight_scale.shape == (E, H, 1)
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(5)).to(DEV)
    weights, ids = layer.method.route(layer, x)
    forms = {"rows": MoEConfig("rows", rows=2, up_n=32, up_k=128, down_n=64, down_k=32),
             "tiles": MoEConfig("tiles", block_m=16, up_n=32, up_k=64, down_n=64, down_k=32)}
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    no_dequantise(layer)
    try:
        for cfg in forms.values():
            check(TritonMoE(lambda *_, c=cfg: c).apply(layer, x, weights, ids), ref)
    finally:
        del layer.experts.expert_weight


GPU_SHAPES = [  # n, E, k, H, I, router (, activation)
    (1, 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
    (4, 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
    (64, 128, 8, 2048, 768, RouterSpec("softmax", 128, 8)),
    (4, 256, 8, 2048, 512, RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4,
                                      scaling=2.5)),
    (300, 256, 8, 2048, 512, RouterSpec("sigmoid", 256, 8, n_group=8, topk_group=4,
                                        scaling=2.5)),
    # DiffusionGemma: I = 704 (scales per weight row), GELU; a round's few rows and a canvas
    (2, 128, 8, 2816, 704, RouterSpec("softmax", 128, 8), "gelu_pytorch_tanh"),
    (256, 128, 8, 2816, 704, RouterSpec("softmax", 128, 8), "gelu_pytorch_tanh"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_SHAPES, ids=lambda c: f"n{c[0]}-E{c[1]}-I{c[4]}")
def test_fp8_real_shapes_gpu(case):
    n, e, k, h, i, spec, *activation = case
    layer = make_fp8_layer(spec, torch.bfloat16, h, i, seed=n)
    layer.experts.activation = activation[0] if activation else "silu"
    assert fp8_blocks(layer.experts)
    x = torch.randn(n, h, device=DEV, dtype=torch.bfloat16)
    weights, ids = layer.method.route(layer, x)
    ref = ReferenceMoE().apply(layer, x, weights, ids)
    no_dequantise(layer)
    check(layer.method.apply(layer, x, weights, ids), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4, 64])
def test_fp8_graph_replay_bit_identical_gpu(n):
    layer = make_fp8_layer(RouterSpec("softmax", 128, 8), torch.bfloat16, 2048, 768, seed=7)
    method = layer.method

    def moe(x):
        return method.apply(layer, x, *method.route(layer, x))

    assert_replay_matches_eager(moe, (n, 2048))


# --- the fp16 operands of the tiles form for bf16 x -------------------------------------------

@triton.jit
def _dot_kernel(a_ptr, w_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, KK: tl.constexpr):
    m, n, kk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, KK)
    a = tl.load(a_ptr + m[:, None] * KK + kk[None, :])
    a16, down = f16_rows(a)
    part = _fp8_dot(a, a16, down, w_ptr + n[:, None] * KK + kk[None, :], "tf32")
    tl.store(out_ptr + m[:, None] * N + n[None, :], part)


def test_bf16_rows_dot_on_fp16_operands():
    """One K step of the tiles form for bf16 rows (`f16_rows`, `_fp8_dot`): rows of every
    magnitude from 1e-30 to 1e30, an all-zero row, a row of ones holding one 1e20 (its ones
    fall below 2^-28 of the largest: rounded, as documented) against the exact float64
    product of the bf16 and e4m3 values: relative error (to the row's largest output) below
    1e-6, the fp32 summation's."""
    gen = torch.Generator().manual_seed(0)
    m, n, kk = 16, 32, 128
    mags = torch.tensor([1e-30, 1e-8, 1e-3, 1, 1e3, 1e8, 1e30, 0] + [1] * 8)
    a = (torch.randn(m, kk, generator=gen) * mags[:, None]).bfloat16().to(DEV)
    a[8, 5] = 1e20
    w = (torch.randn(n, kk, generator=gen) * 100).to(torch.float8_e4m3fn).to(DEV)
    out = torch.empty(m, n, device=DEV)
    _dot_kernel[(1,)](a, w, out, M=m, N=n, KK=kk)
    exact = a.double() @ w.double().T
    scale = exact.abs().amax(dim=1, keepdim=True)
    err = (out.double() - exact).abs() / scale.clamp_min(1e-300)
    assert not out[7].any() and err.max() < 1e-6, err.amax(dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unrolled_steps_sum_identically(dtype):
    """The tiles form with 1, 2 and 4 K steps per loop iteration: bit-identical outputs (the
    same steps in the same order; I = 128 in steps of 64 takes 2 where 4 is asked)."""
    if dtype == torch.bfloat16 and DEV == "cpu":
        pytest.skip("the interpreter's bf16 dot is unreliable (module docstring)")
    layer = make_fp8_layer(RouterSpec("softmax", E, K), dtype=dtype, seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, H, generator=gen).to(DEV, dtype)
    weights, ids = layer.method.route(layer, x)
    outs = [TritonMoE(lambda *_, u=u: MoEConfig("tiles", block_m=16, up_n=32, up_k=64,
                                                  down_n=64, down_k=64, unroll=u))
            .apply(layer, x, weights, ids) for u in (1, 2, 4)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    check(outs[0], ReferenceMoE().apply(layer, x, weights, ids))


def test_unroll_divides_the_steps():
    assert [unroll_for(768, 128, u) for u in (1, 2, 4, 8)] == [1, 2, 3, 6]
    assert unroll_for(2048, 128, 4) == 4 and unroll_for(384, 128, 2) == 1


def _compile(out: Path) -> None:
    from dlrt.kernels.moe import _tiles_kernel

    sig = dict(in_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", out_ptr="*bf16",
               table_ptr="*i32", wt_ptr="*fp32", T="i32", N_OUT="i32")
    consts = dict(K=2048, TOPK=8, GATED=True, ACTIVATION="silu", BLOCK_M=16, BLOCK_N=64,
                  BLOCK_K=128, PRECISION="tf32", FP8=True, PDL=True, UNROLL=2,
                  ROW_BLOCK=128, SCALE_COLS=16)
    (out / "tiles_fp8.ptx").write_text(compile_sm90(_tiles_kernel, sig, consts, num_warps=4,
                                                    num_stages=3))


@pytest.fixture(scope="module")
def ptx(tmp_path_factory) -> list[str]:
    return body((ptx_folder(tmp_path_factory, __file__, "moefp8ptx") / "tiles_fp8.ptx")
                .read_text())


def test_sm90_tiles_convert_e4m3_to_fp16_only(ptx):
    """bf16 x: the gate-up tiles form converts the e4m3 tiles with packed e4m3x2 -> f16x2
    instructions only (no fp16 -> bf16 step) and multiplies on fp16 tensor-core operands."""
    assert any(re.match(r"cvt\.rn\.f16x2\.e4m3x2", ln) for ln in ptx)
    assert not any(re.match(r"cvt\.(rn\.)?bf16\.f16", ln) for ln in ptx)
    mma = [ln for ln in ptx if re.match(r"(mma|wgmma)", ln)]
    assert mma and all(".f16.f16" in ln for ln in mma), mma[:2]


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
