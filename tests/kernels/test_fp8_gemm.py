"""The block-scaled FP8 GEMM (`dlrt.kernels.fp8_gemm`) against a test-local reference; its
"dot" kernels on per-channel scales [N, 1] too.

Reference: dequantise (w * scale_inv per 128 x 128 block, in float64) and multiply in float64;
for W8A8, x is first quantised per row and 128-column group exactly as the kernel documents
(s = amax / 448, 1 for an all-zero group; q = e4m3(clamp(x / s, +-448))), so the kernel's
quantisation must be bit-identical and only summation order differs.

CPU (TRITON_INTERPRET=1, fp32 x): the interpreter converts e4m3 both ways (its fp32 -> e4m3
cast mis-rounds across powers of two, so the kernel rounds first there: `exact_cast`, checked
against torch's cast on every e4m3 value and midpoint) and runs fp8 x fp8 dots, so all three
kernels (weight-only, W8A8, the M <= 4 GEMV) run there on awkward shapes (M = 1, 3, 5, 16, 33, 64;
N odd or below a tile; K not a multiple of 128 nor of the K tile; split-K with uneven and
empty splits); its bf16 dot is not usable, so bf16 x runs there only through the weight-only
kernel's fp16-operand dot (computed in fp32 by the interpreter), elsewhere on the GPU. Tolerance:
relative error (max abs difference over max abs reference) < 1e-5 for fp32 output, < 1e-2 for
bf16 output (its rounding). GPU: SDAR-8B shapes (K = 4096; N = 6144, 4096, 24576, 12288;
M = 1, 4, 16) in bf16 with PDL on, the native e4m3 cast against the rounding, and CUDA-graph
captures replayed bit-identical to eager calls. The sm_90 compile tests (CPU, Triton's bundled
ptxas) check the PDL protocol (the GEMV's weight prefetch before its wait included) and that
the tensor-core kernels run as wgmma, W8A8 on e4m3 operands with IEEE division.
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
    global_loads,
    ptx_folder,
)

from dlrt.kernels.fp8_gemm import (  # noqa: E402
    Fp8GemmConfig,
    _round_e4m3,
    fp8_candidates,
    fp8_config,
    fp8_gemm,
    quantize_x,
)
from dlrt.ops import Fp8Activation  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ref_dequant(w: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    if scale_inv.shape == (n, 1) and n > 1:  # per channel: one scale per weight row
        return w.double() * scale_inv.double()
    s = scale_inv.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return w.double() * s


def ref_quant_x(x: torch.Tensor) -> torch.Tensor:
    """x quantised per row and 128-column group, returned dequantised (float64)."""
    m, k = x.shape
    out = torch.empty(m, k, dtype=torch.float64, device=x.device)
    for g in range(0, k, 128):
        xg = x[:, g:g + 128].float()
        amax = xg.abs().amax(dim=1, keepdim=True)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        q = (xg / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        out[:, g:g + 128] = q.double() * s.double()
    return out


def reference(x, w, scale_inv, w8a8: bool) -> torch.Tensor:
    xd = ref_quant_x(x) if w8a8 else x.double()
    return xd @ ref_dequant(w, scale_inv).T


def make(m, n, k, dtype, seed, zero_group=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 2
    if zero_group and k > 128 and m > 1:
        x[1, 128:256] = 0.0  # one all-zero activation group
    w = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(triton_cdiv(n, 128), triton_cdiv(k, 128), generator=gen) * 1e-3 + 1e-4
    return x.to(DEV, dtype), w.to(DEV), s.to(DEV)


def triton_cdiv(a, b):
    return -(-a // b)


def check(out, ref, dtype):
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and err < tol, err


CASES = [  # m, n, k, block_n, block_k, split_k
    (1, 33, 128, 16, 128, 1),
    (3, 129, 200, 32, 64, 2),  # K: not a multiple of 128 nor of 64; N odd, two scale rows
    (3, 17, 40, 16, 32, 1),  # K below one scale block
    (5, 130, 384, 64, 128, 2),  # three K tiles over two splits
    (16, 48, 300, 16, 32, 8),  # ten K tiles over eight splits: uneven, the last empty
    (1, 200, 257, 128, 64, 3),
    (33, 40, 160, 32, 128, 1),  # a round's rows: x padded to 64
]
W8A8_CASES = [  # m, n, k, block_n, split_k
    (1, 33, 128, 16, 1),
    (3, 129, 300, 32, 2),  # partial last group (44 columns), N odd
    (4, 40, 256, 16, 1),  # row 1 has an all-zero group
    (16, 20, 520, 16, 3),
    (64, 24, 136, 16, 2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_weight_only(case, dtype):
    """bf16 x takes the fp16-operand dot (the interpreter computes it in fp32, so it runs on
    the CPU too); the error is then the bf16 output's rounding."""
    m, n, k, bn, bk, split = case
    x, w, s = make(m, n, k, dtype, seed=m * n + k)
    if m > 2:  # rows a million times apart
        x[2] *= 1e6
    cfg = Fp8GemmConfig(bn, bk, split, stages=2)
    out, ref = fp8_gemm(x, w, s, cfg), reference(x, w, s, False)
    for r in range(m):  # each row against its own scale
        check(out[r:r + 1], ref[r:r + 1], dtype)
    assert torch.equal(out, fp8_gemm(x, w, s, cfg))  # deterministic


GEMV_CASES = [  # m, n, k, block_n, block_k, ahead, warps
    (1, 129, 384, 8, 128, 2, 4),  # N odd: the last program's rows clamped
    (3, 40, 512, 4, 256, 4, 1),
    (4, 33, 1024, 4, 512, 1, 1),  # a warp along K: x read as one [1, BLOCK_K] row
    (2, 20, 256, 16, 64, 3, 4),
    (3, 50, 320, 16, 64, 2, 2),  # K: a partial last scale block
]


@pytest.mark.parametrize("case", GEMV_CASES, ids=str)
def test_gemv(case):
    m, n, k, bn, bk, ahead, warps = case
    x, w, s = make(m, n, k, torch.float32, seed=m * k + n)
    cfg = Fp8GemmConfig(bn, bk, 1, stages=ahead, warps=warps, kind="fma")
    assert cfg.fits(n, k) and cfg.x_row() == (bk == 512 and warps == 1)
    out = fp8_gemm(x, w, s, cfg)
    check(out, reference(x, w, s, False), torch.float32)
    assert torch.equal(out, fp8_gemm(x, w, s, cfg))


@pytest.mark.parametrize("case", W8A8_CASES, ids=str)
def test_w8a8(case):
    m, n, k, bn, split = case
    x, w, s = make(m, n, k, torch.float32, seed=m + n * k, zero_group=True)
    out = fp8_gemm(x, w, s, Fp8GemmConfig(bn, 128, split, stages=2, w8a8=True))
    ref = reference(x, w, s, True)
    check(out, ref, torch.float32)
    # the quantisation error is visible: the weight-only product differs from it
    plain = reference(x, w, s, False)
    assert ((plain - ref).abs().max() / ref.abs().max()).item() > 1e-4
    # x quantised by its producer (an Fp8Activation) gives the same result, bit for bit
    cfg = Fp8GemmConfig(bn, 128, split, stages=2, w8a8=True)
    codes = Fp8Activation(*quantize_x(x), x.dtype)
    assert torch.equal(fp8_gemm(codes, w, s, cfg), out)
    assert torch.equal(fp8_gemm(codes, w, s), fp8_gemm(x, w, s, fp8_config(m, n, k, True)))


CHANNEL_CASES = [  # m, n, k, block_n, block_k, split_k, w8a8, x dtype
    (1, 33, 128, 16, 128, 1, False, torch.float32),
    (3, 129, 200, 32, 64, 2, False, torch.float32),  # K: not a multiple of 128 nor 64; N odd
    (3, 129, 200, 32, 64, 2, False, torch.bfloat16),  # the fp16-operand dot
    (16, 48, 300, 16, 32, 8, False, torch.float32),  # uneven splits, the last empty
    (3, 129, 300, 32, 128, 2, True, torch.float32),  # partial last activation group, N odd
    (4, 40, 256, 16, 128, 1, True, torch.float32),  # row 1 has an all-zero group
]


@pytest.mark.parametrize("case", CHANNEL_CASES, ids=str)
def test_per_channel_scales(case):
    """Per-channel scales [N, 1] (compressed-tensors FP8): the "dot" kernels scale each
    output column by its weight row's scale; W8A8 quantises x per token and 128-column group
    as with block scales (x quantised by its producer: the same bits); the GEMV refuses
    them and the candidates leave it out."""
    m, n, k, bn, bk, split, w8a8, dtype = case
    x, w, _ = make(m, n, k, dtype, seed=m * n + k, zero_group=w8a8)
    gen = torch.Generator().manual_seed(n)
    s = (torch.rand(n, 1, generator=gen) * 1e-3 + 1e-4).to(DEV)
    cfg = Fp8GemmConfig(bn, bk, split, stages=2, w8a8=w8a8)
    out = fp8_gemm(x, w, s, cfg)
    ref = reference(x, w, s, w8a8)
    for r in range(m):  # each row against its own scale
        check(out[r:r + 1], ref[r:r + 1], dtype)
    if w8a8:
        codes = Fp8Activation(*quantize_x(x), x.dtype)
        assert torch.equal(fp8_gemm(codes, w, s, cfg), out)
    assert {c.kind for c in fp8_candidates(n, k, w8a8, rows=1, channel=True)} == {"dot"}
    with pytest.raises(ValueError, match="block scales only"):
        fp8_gemm(x[:1], w, s, Fp8GemmConfig(8, 128, 1, stages=1, kind="fma"))


@pytest.mark.parametrize("m, k", [(1, 128), (3, 300), (4, 256), (2, 40)])
def test_quantize_x_bit_identical(m, k):
    """`quantize_x` writes exactly the codes and scales of the reference quantisation (an
    all-zero group gets scale 1; a partial last group scales over its own columns)."""
    from dlrt.kernels.fp8_gemm import quantize_x

    x, _, _ = make(m, 8, k, torch.bfloat16, seed=7 * m + k, zero_group=True)
    q, xs = quantize_x(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, k)
    assert xs.shape == (m, triton_cdiv(k, 128))
    for g in range(xs.shape[1]):
        xg = x[:, g * 128:(g + 1) * 128].float()
        amax = xg.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        assert torch.equal(xs[:, g], s)
        want = (xg / s[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        assert torch.equal(q[:, g * 128:(g + 1) * 128].view(torch.uint8), want.view(torch.uint8))


@triton.jit
def _round_kernel(v_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, _round_e4m3(tl.load(v_ptr + i)))


def test_e4m3_rounding_matches_torch():
    """The in-kernel rounding (used where the cast cannot be trusted) against torch's cast, bit
    for bit (negative values that round to zero give -0.0): every e4m3 value, the midpoints
    between neighbours (ties to even), values just beside them, and random values over the
    whole range, both signs."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite() & (grid >= 0)].sort().values
    mid = (grid[1:] + grid[:-1]) / 2
    gen = torch.Generator().manual_seed(0)
    rand = torch.exp2(torch.rand(4096, generator=gen) * 20 - 11).clamp(max=448.0)
    v = torch.cat([grid, mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(grid[1:]), rand])
    v = torch.cat([v, -v])
    size = triton.next_power_of_2(v.numel())
    v = torch.cat([v, torch.zeros(size - v.numel())]).to(DEV)
    out = torch.empty_like(v)
    _round_kernel[(1,)](v, out, N=size)
    assert torch.equal(out.view(torch.int32), v.to(torch.float8_e4m3fn).float().view(torch.int32))


def test_no_rows_and_default_config():
    x, w, s = make(2, 40, 136, torch.float32, seed=1)
    assert fp8_gemm(x[:0], w, s).shape == (0, 40)
    cfg = fp8_config(2, 40, 136)
    assert cfg.fits(40, 136) and cfg.block_k == 128 and not cfg.w8a8
    check(fp8_gemm(x, w, s), reference(x, w, s, False), torch.float32)


def test_configs_fit():
    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (33, 200)):
        for w8a8 in (False, True):
            cands = fp8_candidates(n, k, w8a8)
            assert cands and all(c.fits(n, k) and c.w8a8 == w8a8 for c in cands)
            for m in (1, 4, 16, 64):
                assert fp8_config(m, n, k, w8a8).fits(n, k)
    assert not Fp8GemmConfig(64, 256).fits(64, 512)  # a K tile across two scale blocks
    assert not Fp8GemmConfig(64, 64, w8a8=True).fits(64, 512)  # W8A8: a tile is a group
    assert not Fp8GemmConfig(64, 128, split_k=3).fits(64, 256)  # an empty split by design
    gemv = dict(split_k=1, stages=2, kind="fma")
    assert Fp8GemmConfig(8, 256, **gemv).fits(33, 512)
    assert not Fp8GemmConfig(8, 256, **gemv).fits(33, 640)  # K: not a multiple of the tile
    assert not Fp8GemmConfig(256, 256, **gemv).fits(512, 512)  # two scale rows per program
    assert not Fp8GemmConfig(8, 256, w8a8=True, **gemv).fits(33, 512)
    assert {c.kind for c in fp8_candidates(4096, 4096, rows=4)} == {"dot", "fma"}
    assert {c.kind for c in fp8_candidates(4096, 4096, rows=8)} == {"dot"}
    assert {c.kind for c in fp8_candidates(4096, 4096, True, rows=1)} == {"dot"}


def test_rejects_bad_inputs():
    x, w, s = make(2, 40, 136, torch.float32, seed=2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_gemm(x, w.float(), s)
    with pytest.raises(ValueError, match="scale_inv"):
        fp8_gemm(x, w, s[:, :1].contiguous())
    with pytest.raises(ValueError, match="M<=64"):
        fp8_gemm(torch.zeros(65, 136, device=DEV), w, s)
    with pytest.raises(ValueError, match="M<=64"):
        fp8_gemm(torch.zeros(2, 128, device=DEV), w, s)  # K differs
    with pytest.raises(ValueError, match="float64"):
        fp8_gemm(x.double(), w, s)
    with pytest.raises(ValueError, match="does not fit"):
        fp8_gemm(x, w, s, Fp8GemmConfig(16, 64, w8a8=True))
    with pytest.raises(ValueError, match="M<=4"):
        fp8_gemm(torch.zeros(5, 128, device=DEV), w[:, :128].contiguous(), s[:, :1].contiguous(),
                 Fp8GemmConfig(8, 128, stages=1, kind="fma"))
    codes = Fp8Activation(*quantize_x(x), x.dtype)
    with pytest.raises(ValueError, match="quantised x needs a W8A8 config"):
        fp8_gemm(codes, w, s, Fp8GemmConfig(16, 64))
    with pytest.raises(ValueError, match="do not fit K=128"):
        fp8_gemm(codes, w[:, :128].contiguous(), s[:, :1].contiguous())
    with pytest.raises(ValueError, match="do not fit"):
        fp8_gemm(Fp8Activation(codes.q, codes.scale[:, :1].contiguous(), x.dtype), w, s)


# --- GPU -------------------------------------------------------------------------------------

SDAR_8B = [(6144, 4096), (4096, 4096), (24576, 4096), (12288, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("w8a8", [False, True], ids=["weight_only", "w8a8"])
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("shape", SDAR_8B, ids=str)
def test_real_shapes_gpu(shape, m, w8a8):
    n, k = shape
    x, w, s = make(m, n, k, torch.bfloat16, seed=n + m, zero_group=True)
    ref = reference(x, w, s, w8a8)
    cands = fp8_candidates(n, k, w8a8, x.device, rows=m)  # with the GEMV's at m <= 4
    for cfg in [fp8_config(m, n, k, w8a8, x.device)] + cands[::5]:
        check(fp8_gemm(x, w, s, cfg), ref, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("w8a8", [False, True], ids=["weight_only", "w8a8"])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_per_channel_real_shapes_gpu(m, w8a8):
    """Per-channel scales at SDAR-8B's q/k/v shape in bf16, every "dot" candidate's tenth."""
    n, k = 6144, 4096
    x, w, _ = make(m, n, k, torch.bfloat16, seed=n + m, zero_group=True)
    s = (torch.rand(n, 1, device=DEV) * 1e-3 + 1e-4).contiguous()
    ref = reference(x, w, s, w8a8)
    cands = fp8_candidates(n, k, w8a8, x.device, rows=m, channel=True)
    for cfg in [fp8_config(m, n, k, w8a8, x.device)] + cands[::10]:
        check(fp8_gemm(x, w, s, cfg), ref, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["weight_only", "w8a8", "gemv"])
def test_graph_replay_bit_identical_gpu(kind):
    n, k, m = 4096, 4096, 4
    _, w, s = make(m, n, k, torch.bfloat16, seed=3)
    cfg = fp8_config(m, n, k, kind == "w8a8", w.device)
    assert cfg.split_k > 1  # the reduction kernel is captured too
    if kind == "gemv":
        cfg = Fp8GemmConfig(8, 512, 1, stages=2, warps=4, kind="fma")
    # fed by the RMSNorm kernel inside the graph: a PDL producer, as in a layer
    from dlrt.kernels.rms_norm import rms_norm

    norm_w = torch.rand(k, device=DEV, dtype=torch.bfloat16) + 0.5
    assert_replay_matches_eager(lambda x: fp8_gemm(rms_norm(x, norm_w, 1e-6), w, s, cfg),
                                (m, k))


@pytest.mark.gpu
def test_native_cast_matches_the_rounding_gpu(monkeypatch):
    """On the GPU the W8A8 kernel casts with cvt.rn.satfinite; the rounding the CPU tests run
    instead must give bit-identical products."""
    import dlrt.kernels.fp8_gemm as mod

    x, w, s = make(16, 4096, 4096, torch.bfloat16, seed=5, zero_group=True)
    cfg = Fp8GemmConfig(64, 128, 4, w8a8=True)
    native = fp8_gemm(x * 37.0, w, s, cfg)
    monkeypatch.setattr(mod, "exact_cast", lambda x: True)
    assert torch.equal(native, fp8_gemm(x * 37.0, w, s, cfg))


# --- sm_90 code (compiled on the CPU) ----------------------------------------------------------

def _compile(out: Path) -> None:
    """Write <variant>.ptx of the kernels at an SDAR-8B shape with PDL on (no interpreter)."""
    from dlrt.kernels.fp8_gemm import _fp8_gemm_kernel, _quant_x_kernel
    from dlrt.kernels.skinny_gemm import _gemv_kernel

    for name, w8a8, channel in (("weight_only", False, False), ("w8a8", True, False),
                                ("weight_only_channel", False, True),
                                ("w8a8_channel", True, True)):
        sig = dict(x_ptr="*fp8e4nv" if w8a8 else "*bf16", xs_ptr="*fp32", w_ptr="*fp8e4nv",
                   s_ptr="*fp32", y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32", M="i32",
                   N="i32")
        consts = dict(K=4096, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, FUSED=True,
                      W8A8=w8a8, CHANNEL=channel, PRECISION="tf32", PDL=True)
        ptx = compile_sm90(_fp8_gemm_kernel, sig, consts, num_stages=4, num_warps=4)
        (out / f"{name}.ptx").write_text(ptx)
    sig = dict(x_ptr="*bf16", q_ptr="*fp8e4nv", xs_ptr="*fp32")
    ptx = compile_sm90(_quant_x_kernel, sig, dict(K=4096, EXACT_CAST=False, PDL=True),
                       num_stages=1, num_warps=1)
    (out / "quant_x.ptx").write_text(ptx)
    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", y_ptr="*bf16", N="i32")
    for name, (consts, warps) in GEMV_PTX.items():
        ptx = compile_sm90(_gemv_kernel, sig, dict(consts, SCALED=True), num_stages=1,
                           num_warps=warps)
        (out / f"{name}.ptx").write_text(ptx)


@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory) -> Path:
    return ptx_folder(tmp_path_factory, __file__, "fp8ptx")


_GEMV = dict(K=4096, ROWS=4, VEC=16, X_ROW=False, PDL=True)
GEMV_PTX = {  # name: (constexprs, warps): a scale per column (512-wide tiles), one per tile
    "gemv": (dict(_GEMV, BLOCK_N=8, BLOCK_K=512, AHEAD=2), 4),
    "gemv128": (dict(_GEMV, BLOCK_N=16, BLOCK_K=128, AHEAD=4), 2),
}


@pytest.mark.parametrize("name", sorted(GEMV_PTX))
def test_sm90_gemv_code(ptx_dir, name):
    """The GEMV loads its first AHEAD weight tiles (16-byte loads) and the scales before the
    PDL wait, x only after it; it releases its dependent after its last FMA; its loop has no
    barrier (x and the scales are read in the weight tile's layout)."""
    text = (ptx_dir / f"{name}.ptx").read_text()
    lines = body(text)
    consts, warps = GEMV_PTX[name]
    wait = min(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
    release = min(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.launch"))
    early = [ln for ln in lines[:wait] if ln.startswith("ld.global")]
    per_tile = consts["BLOCK_N"] * consts["BLOCK_K"] // 16 // (32 * warps)
    assert sum(ln.startswith("ld.global.v4") for ln in early) == consts["AHEAD"] * per_tile
    assert not [ln for ln in early if ".b16" in ln]  # no bf16 x before the wait
    fmas = [i for i, ln in enumerate(lines) if re.match(r"fma\.", ln)]
    assert fmas and wait < min(fmas) and max(fmas) < release
    raw = text.splitlines()
    heads = [(i, ln.split(":")[0].strip()) for i, ln in enumerate(raw) if "Loop Header" in ln]
    assert heads
    for start, label in heads:
        back = re.compile(rf"bra(\.uni)?\s+{re.escape(label)};")
        end = max(i for i, ln in enumerate(raw) if back.search(ln))
        assert not [ln for ln in raw[start:end] if "bar.sync" in ln or "barrier" in ln]


@pytest.mark.parametrize("name", ["weight_only", "w8a8", "weight_only_channel",
                                  "w8a8_channel"])
def test_sm90_code(ptx_dir, name):
    """Block scales and per-channel scales ("_channel") alike."""
    lines = body((ptx_dir / f"{name}.ptx").read_text())
    wait = min(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
    release = min(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.launch"))
    loads = global_loads(lines)
    math = [i for i, ln in enumerate(lines) if re.match(r"(mma|wgmma)\.", ln)]
    assert loads and min(loads) > wait, "a global load before the PDL wait"
    assert math and max(math) < release, "the dependent is released inside the main loop"
    # the weight tile is the A operand of an m64 warpgroup MMA (fp8 x fp8 for W8A8; fp16 for
    # weight-only with bf16 x, its e4m3 tile converted by packed instructions only)
    kind = "e4m3.e4m3" if name.startswith("w8a8") else "f16.f16"
    if name.startswith("weight_only"):
        assert any(re.match(r"cvt\.rn\.f16x2\.e4m3x2", ln) for ln in lines)
        assert not any(re.match(r"cvt\.(rn\.)?bf16\.f16", ln) for ln in lines)
    assert any(lines[i].startswith("wgmma.mma_async") and kind in lines[i] for i in math)


def test_sm90_quant_x_code(ptx_dir):
    """The W8A8 activation quantisation casts with cvt.rn.satfinite and divides in IEEE."""
    lines = body((ptx_dir / "quant_x.ptx").read_text())
    assert any(re.match(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ln) for ln in lines)
    assert not any(re.match(r"div\.(full|approx)", ln) for ln in lines)  # IEEE division


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
