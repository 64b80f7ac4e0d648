"""The W8A8 activation quantisation fused into its producers: `rms_norm_fp8` (RMSNorm, with
or without the residual add) and `silu_mul_fp8` write the e4m3 codes and per-(row, 128-column
group) scales of their output instead of the output.

Against the unfused kernels: the codes (compared as bytes, so the sign of zero counts) and the
scales equal `quantize_x(rms_norm(...))` / `quantize_x(silu_mul(...))` bit for bit, and the
residual is updated identically. Random inputs (fixed seeds) with rows scaled by 1e-3 and 1e3,
an all-zero row, an all-zero group, zero weights and gates of -100 (signed zeros in the output)
and values that quantise to zero or to e4m3 subnormals; rows 1, 3, 17; hidden sizes below one
group, with a partial last group, and many groups.

Against the CPU reference path: the dequantised value (codes * scale per group, in fp32, cast to
the dtype) equals `dlrt.layers.quant.fp8.quantize_activations` of `dlrt.ops.reference`'s output.
Those inputs are built so that the kernel's and the reference's unquantised outputs are equal
bit for bit (small integers scaled by powers of two: exact sums and square roots, products that
fit the dtype; gates >= 32, 0 or -128, whose SiLU is g, 0 or -0 whatever the exp), so the test
compares the quantisation itself.

Runs under TRITON_INTERPRET=1 on the CPU (bf16 there: the interpreter rounds fp32 -> bf16 by
truncation, in the fused and the unfused kernels alike) and natively on the GPU, where one more
test runs the SDAR-8B shapes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.kernels.activation import silu_mul, silu_mul_fp8  # noqa: E402
from dlrt.kernels.fp8_gemm import quantize_x  # noqa: E402
from dlrt.kernels.rms_norm import rms_norm, rms_norm_fp8  # noqa: E402
from dlrt.layers.quant.fp8 import quantize_activations  # noqa: E402
from dlrt.ops import reference  # noqa: E402

# gates of -100 / -128: exp(-g) overflows to inf (silu -0.0), as intended
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32]
ROWS = [1, 3, 17]
EPS = 1e-6


def assert_same_quant(got: tuple[torch.Tensor, torch.Tensor],
                      want: tuple[torch.Tensor, torch.Tensor]) -> None:
    (q, s), (wq, ws) = got, want
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert q.shape == wq.shape and s.shape == ws.shape
    assert torch.equal(s, ws)
    assert torch.equal(q.view(torch.uint8), wq.view(torch.uint8))


def dequantize(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes * scale per 128-column group, in fp32, cast to dtype."""
    return (q.float() * s.repeat_interleave(128, dim=1)[:, :q.shape[1]]).to(dtype)


def scale_rows(t: torch.Tensor, small: float, large: float) -> torch.Tensor:
    """Row r: as drawn (r % 4 == 0), * small (1), all zero (2), * large (3)."""
    t = t.clone()
    t[1::4] *= small
    t[2::4] = 0.0
    t[3::4] *= large
    return t


def random_rows(n: int, h: int, gen: torch.Generator) -> torch.Tensor:
    """randn * 3 with rows scaled by 1e-3 / 1e3 / 0, and in row 0 values ~1e-7 of the row's
    magnitude (they quantise to zero, keeping their sign) and -0.0."""
    x = torch.randn(n, h, generator=gen) * 3
    x[0, 5::37] = -1e-7
    x[0, 9::37] = 1e-7
    x[0, 13::37] = -0.0
    return scale_rows(x, 1e-3, 1e3)


# --- against the unfused kernels -----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("h", [64, 200, 2048])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_fp8_equals_quantize_x(n, h, with_residual, dtype):
    gen = torch.Generator().manual_seed(1000 * n + h)
    x = random_rows(n, h, gen).to(DEV, dtype)
    res = scale_rows(torch.randn(n, h, generator=gen), 1e-3, 1e3).to(DEV, dtype)
    weight = torch.rand(h, generator=gen) + 0.5
    weight[::11] = 0.0  # zeros (of either sign) in the output
    weight = weight.to(DEV, dtype)
    if h > 128 and n > 1:
        x[0, 128:256] = 0.0  # one all-zero group in a row that is not
        res[0, 128:256] = 0.0
    want_res = res.clone() if with_residual else None
    want = quantize_x(rms_norm(x, weight, EPS, want_res))
    got_res = res.clone() if with_residual else None
    got = rms_norm_fp8(x, weight, EPS, got_res)
    assert_same_quant(got, want)
    if with_residual:
        assert torch.equal(got_res, want_res)
        assert not torch.equal(got_res, res)
    assert (got[1] == 1.0).any() == (n > 1)  # the all-zero row's scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("i", [64, 200, 1500])
def test_silu_mul_fp8_equals_quantize_x(n, i, dtype):
    gen = torch.Generator().manual_seed(1000 * n + i)
    gate = random_rows(n, i, gen)
    gate[0, 3::29] = -100.0  # silu -0.0
    up = scale_rows(torch.randn(n, i, generator=gen), 1e-3, 1e3)
    if i > 1024 and n > 1:
        gate[0, 1024:1152] = 0.0  # an all-zero group, in the second program's columns
    gate_up = torch.cat([gate, up], dim=1).to(DEV, dtype)
    want = quantize_x(silu_mul(gate_up))
    got = silu_mul_fp8(gate_up)
    assert_same_quant(got, want)
    assert (got[1] == 1.0).any() == (n > 1)


# --- against the CPU reference path ----------------------------------------------------------

def exact_norm_rows(n: int, h: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of values in {0, +-1, +-2, +-3} whose mean square is exactly 4 (10 of the h are
    +-1, 5 are 0, 10 are +-3, the rest +-2: 10 + 9 * 10 + 4 * (h - 25) = 4h), shuffled, with
    rows scaled by 2^-10 / 0 / 2^10: the norm's h = x / 2 exactly (eps = 2^-60)."""
    mags = torch.tensor([1.0] * 10 + [0.0] * 5 + [3.0] * 10 + [2.0] * (h - 25))
    rows = []
    for _ in range(n):
        signs = torch.randint(0, 2, (h,), generator=gen) * 2 - 1
        rows.append(mags[torch.randperm(h, generator=gen)] * signs)
    return scale_rows(torch.stack(rows), 2.0 ** -10, 2.0 ** 10)


def exact_values(shape: tuple[int, ...], gen: torch.Generator, low: int) -> torch.Tensor:
    """+-m/16 * 2^e, m in 16..31 (5 significant bits), e in low..2: its products with values of
    at most 3 significant bits fit bf16's 8."""
    m = torch.randint(16, 32, shape, generator=gen).float() / 16
    e = torch.randint(low, 3, shape, generator=gen).float()
    return m * torch.exp2(e) * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("h", [64, 200, 2048])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_fp8_matches_reference(n, h, with_residual, dtype):
    if DEV == "cuda" and dtype == torch.float32:
        pytest.skip("on the GPU the kernel's mean (div.full) and rsqrt are approximations: its "
                    "fp32 output may differ from the reference's by an ulp")
    eps = 2.0 ** -60
    gen = torch.Generator().manual_seed(n + h)
    target = exact_norm_rows(n, h, gen)
    weight = exact_values((h,), gen, -24)  # 2^-24 .. 2^2: codes down to e4m3 subnormals and 0
    weight[::13] = 0.0
    weight = weight.to(DEV, dtype)
    if with_residual:  # x + residual = target, exactly
        x = scale_rows(torch.randint(-3, 4, (n, h), generator=gen).float(), 2.0 ** -10,
                       2.0 ** 10)
        x, res = x.to(DEV, dtype), (target - x).to(DEV, dtype)
        want_y, want_res = reference.add_rms_norm(x, res, weight, eps)
        # the inputs are exact: the unfused kernel's output is the reference's
        assert torch.equal(rms_norm(x, weight, eps, res.clone()), want_y)
        got = rms_norm_fp8(x, weight, eps, res)
        assert torch.equal(res, want_res)
    else:
        x = target.to(DEV, dtype)
        want_y = reference.rms_norm(x, weight, eps)
        assert torch.equal(rms_norm(x, weight, eps), want_y)
        got = rms_norm_fp8(x, weight, eps)
    assert torch.equal(dequantize(*got, dtype), quantize_activations(want_y))
    assert (got[0].view(torch.uint8) == 0x80).any()  # -0.0 codes (negative values below 2^-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("i", [64, 200, 1500])
def test_silu_mul_fp8_matches_reference(n, i, dtype):
    gen = torch.Generator().manual_seed(n + i)
    # gates: 32 .. 224 with 3 significant bits (silu(g) = g: exp(-g) < 2^-24), 0, or -128
    # (silu -0.0); ups: 5 significant bits, 2^-30 .. 2^2
    gate = (torch.randint(4, 8, (n, i), generator=gen)
            * torch.exp2(torch.randint(3, 6, (n, i), generator=gen).float()))
    pick = torch.rand(n, i, generator=gen)
    gate[pick < 0.1] = 0.0
    gate[pick > 0.9] = -128.0
    up = scale_rows(exact_values((n, i), gen, -30), 2.0 ** -10, 2.0 ** 10)
    gate_up = torch.cat([gate.float(), up], dim=1).to(DEV, dtype)
    want_y = reference.silu_and_mul(gate_up)
    assert torch.equal(silu_mul(gate_up), want_y)  # exact inputs: the kernel's output
    got = silu_mul_fp8(gate_up)
    assert torch.equal(dequantize(*got, dtype), quantize_activations(want_y))
    assert (got[0].view(torch.uint8) == 0x80).any()


# --- errors, empty inputs, GPU shapes ----------------------------------------------------------

def test_errors_and_empty():
    w = torch.ones(4, device=DEV)
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm_fp8(torch.zeros(6, 4, device=DEV).t(), torch.ones(6, device=DEV), EPS)
    with pytest.raises(ValueError, match=r"\[N, H\]"):
        rms_norm_fp8(torch.zeros(4, device=DEV), w, EPS)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_fp8(torch.zeros(2, 4, device=DEV), w, EPS, torch.zeros(3, 4, device=DEV))
    with pytest.raises(ValueError, match=r"\[N, 2I\]"):
        silu_mul_fp8(torch.zeros(2, 5, device=DEV))
    with pytest.raises(ValueError, match=r"\[N, 2I\]"):
        silu_mul_fp8(torch.zeros(2, 2, 4, device=DEV))
    with pytest.raises(ValueError, match="contiguous"):
        silu_mul_fp8(torch.zeros(8, 2, device=DEV).t())
    q, s = rms_norm_fp8(torch.zeros(0, 300, device=DEV), torch.ones(300, device=DEV), EPS)
    assert q.shape == (0, 300) and s.shape == (0, 3) and q.dtype == torch.float8_e4m3fn
    q, s = silu_mul_fp8(torch.zeros(0, 600, device=DEV))
    assert q.shape == (0, 300) and s.shape == (0, 3) and s.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_model_shapes_gpu(n):
    """SDAR-8B (H 4096: 16 warps per row; I 12288: 12 programs per row) in bf16 with PDL."""
    gen = torch.Generator().manual_seed(n)
    x = random_rows(n, 4096, gen).to(DEV, torch.bfloat16)
    res = torch.randn(n, 4096, generator=gen).to(DEV, torch.bfloat16)
    weight = (torch.rand(4096, generator=gen) + 0.5).to(DEV, torch.bfloat16)
    want_res, got_res = res.clone(), res.clone()
    assert_same_quant(rms_norm_fp8(x, weight, EPS, got_res),
                      quantize_x(rms_norm(x, weight, EPS, want_res)))
    assert torch.equal(got_res, want_res)
    assert_same_quant(rms_norm_fp8(x, weight, EPS), quantize_x(rms_norm(x, weight, EPS)))
    gate_up = (torch.randn(n, 2 * 12288, generator=gen) * 4).to(DEV, torch.bfloat16)
    assert_same_quant(silu_mul_fp8(gate_up), quantize_x(silu_mul(gate_up)))


@pytest.mark.gpu
def test_torch_quantisation_matches_the_kernels_gpu():
    """The torch quantisations (`Fp8Activation.quantize`, the reference W8A8 path and the
    fused-input check's expectation; `quantize_fp8_block`, online weight quantisation) divide
    in IEEE on the GPU too: the same codes and scales as `quantize_x` and as on the CPU, for
    amaxes spread over 12 decades."""
    from dlrt.layers.quant.fp8 import quantize_fp8_block
    from dlrt.ops import Fp8Activation

    gen = torch.Generator().manual_seed(3)
    spread = torch.logspace(-6, 6, 256)[:, None]
    x = (torch.randn(256, 1000, generator=gen) * spread).to(DEV, torch.bfloat16)
    got = Fp8Activation.quantize(x)
    assert_same_quant((got.q, got.scale), quantize_x(x))
    w = torch.randn(1000, 1000, generator=gen) * spread.repeat_interleave(4, 0)[:1000]
    q, s = quantize_fp8_block(w.to(DEV))
    want_q, want_s = quantize_fp8_block(w)
    assert_same_quant((q.cpu(), s.cpu()), (want_q, want_s))
