"""The NVFP4 weight-only GEMM (`dlrt.kernels.nvfp4_gemm`) against a test-local reference.

Reference: unpack each byte (low nibble = element 2j, high nibble = element 2j + 1), decode
e2m1 by table (0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign), multiply by the per-16 e4m3 scale
and the global scale (one, or one per row) in float64, then matmul in float64. The kernel's
dequantised tile is exact, so only fp32 summation order and the global scale's fp32 product
differ.

CPU (TRITON_INTERPRET=1, fp32 and bf16 x): awkward shapes (M = 1, 3, 5, 16, 40; N odd or below
a tile; K not a multiple of the tile, and not of 16), split-K with uneven splits, every code in
both nibbles, the nibble order. bf16 x runs through fp16 operands, whose dots the interpreter
computes in fp32; each output row is checked against its own scale. Tolerance: relative error
(max abs difference over max abs reference) < 1e-5 for fp32 output, < 1e-2 for bf16 output.
GPU: SDAR-8B shapes (K = 4096; N = 6144, 4096, 24576, 12288; M = 1, 4, 16) with PDL on, and a
CUDA-graph capture replayed bit-identical to eager calls. sm_90 compile test (CPU): the PDL
protocol, tensor-core dots on fp16 operands for bf16 x, no lookup loads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import (  # noqa: E402
    assert_replay_matches_eager,
    body,
    compile_sm90,
    global_loads,
    ptx_folder,
)

from dlrt.kernels.nvfp4_gemm import (  # noqa: E402
    Nvfp4GemmConfig,
    nvfp4_candidates,
    nvfp4_config,
    nvfp4_gemm,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
LUT = torch.cat([LUT, -LUT])


def ref_dequant(w, w_scale, global_scale) -> torch.Tensor:
    n, half = w.shape
    codes = torch.stack([w.long() & 15, w.long() >> 4], dim=-1).reshape(n, 2 * half)
    vals = LUT.to(w.device)[codes]
    s = w_scale.double().repeat_interleave(16, dim=1)[:, :2 * half]
    return vals * s * global_scale.double()


def reference(x, w, w_scale, global_scale) -> torch.Tensor:
    g = global_scale.double().reshape(-1, 1)  # one, or one per row
    return x.double() @ ref_dequant(w, w_scale, torch.ones(())).mul(g).T


def make(m, n, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s = (torch.rand(n, -(-k // 16), generator=gen) * 8 + 0.01).to(torch.float8_e4m3fn)
    g = torch.tensor([0.0123], dtype=torch.float32)
    return x.to(DEV, dtype), w.to(DEV), s.to(DEV), g.to(DEV)


def check(out, ref, dtype):
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and err < tol, err


CASES = [  # m, n, k, block_n, block_k, split_k
    (1, 33, 64, 16, 64, 1),
    (3, 129, 200, 32, 64, 2),  # K: not a multiple of 16 nor of the tile; N odd
    (3, 17, 40, 16, 32, 1),
    (5, 70, 512, 64, 128, 3),  # four tiles over three splits
    (16, 48, 96, 16, 32, 2),
    (1, 20, 520, 16, 256, 2),
    (40, 24, 64, 16, 32, 1),  # a round's rows: x padded to 64
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_against_reference(case, dtype):
    """bf16 x takes the fp16-operand dots (computed in fp32 by the interpreter, so they run
    on the CPU too), checked row by row; one row is a million times the others."""
    m, n, k, bn, bk, split = case
    x, w, s, g = make(m, n, k, dtype, seed=m * n + k)
    if m > 2:
        x[2] *= 1e6
    cfg = Nvfp4GemmConfig(bn, bk, split, stages=2)
    out = nvfp4_gemm(x, w, s, g, cfg)
    for r, want in enumerate(reference(x, w, s, g)):
        check(out[r:r + 1], want[None], dtype)
    assert torch.equal(out, nvfp4_gemm(x, w, s, g, cfg))
    # one global scale per row (merged projections)
    rows = torch.linspace(0.001, 0.1, n, device=DEV)
    for r, want in enumerate(reference(x, w, s, rows)):
        check(nvfp4_gemm(x, w, s, rows, cfg)[r:r + 1], want[None], dtype)


def test_codes_and_nibble_order():
    """Row r of the weight holds code r in the low nibble of every byte and code 15 - r in the
    high nibble; x picks single columns: y[0] reads even elements, y[1] odd ones."""
    n, k = 16, 32
    codes = torch.arange(16, dtype=torch.uint8)
    w = (codes[:, None] | ((15 - codes[:, None]) << 4)).expand(n, k // 2).contiguous()
    s = torch.full((n, k // 16), 2.0).to(torch.float8_e4m3fn)
    g = torch.tensor([0.5])
    x = torch.zeros(2, k)
    x[0, 6] = 1.0  # element 6: the low nibble of byte 3
    x[1, 7] = 1.0  # element 7: its high nibble
    for dtype in (torch.float32, torch.bfloat16):  # bf16: the fp16-operand path
        y = nvfp4_gemm(x.to(DEV, dtype), w.to(DEV), s.to(DEV), g.to(DEV),
                       Nvfp4GemmConfig(16, 32))
        assert torch.equal(y[0].cpu().float(), LUT.float())  # 2 * 0.5 * e2m1(code r)
        assert torch.equal(y[1].cpu().float(), LUT.flip(0).float())


def test_no_rows_and_default_config():
    x, w, s, g = make(2, 40, 96, torch.float32, seed=1)
    assert nvfp4_gemm(x[:0], w, s, g).shape == (0, 40)
    check(nvfp4_gemm(x, w, s, g), reference(x, w, s, g), torch.float32)
    for n, k in ((6144, 4096), (4096, 12288), (24576, 4096), (33, 200)):
        cands = nvfp4_candidates(n, k)
        assert cands and all(c.fits(n, k) for c in cands)
        assert all(nvfp4_config(m, n, k).fits(n, k) for m in (1, 4, 16, 64))


def test_rejects_bad_inputs():
    x, w, s, g = make(2, 40, 96, torch.float32, seed=2)
    with pytest.raises(ValueError, match="uint8"):
        nvfp4_gemm(x, w.to(torch.int16), s, g)
    with pytest.raises(ValueError, match="does not hold"):
        nvfp4_gemm(torch.zeros(2, 64, device=DEV), w, s, g)
    with pytest.raises(ValueError, match="K even"):
        nvfp4_gemm(torch.zeros(2, 95, device=DEV), w, s, g)
    with pytest.raises(ValueError, match="w_scale"):
        nvfp4_gemm(x, w, s.float(), g)
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_gemm(x, w, s, g.double())
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_gemm(x, w, s, torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="M<=64"):
        nvfp4_gemm(torch.zeros(65, 96, device=DEV), w, s, g)
    with pytest.raises(ValueError, match="does not fit"):
        nvfp4_gemm(x, w, s, g, Nvfp4GemmConfig(16, 16))


# --- GPU -------------------------------------------------------------------------------------

SDAR_8B = [(6144, 4096), (4096, 4096), (24576, 4096), (12288, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("shape", SDAR_8B, ids=str)
def test_real_shapes_gpu(shape, m):
    n, k = shape
    x, w, s, g = make(m, n, k, torch.bfloat16, seed=n + m)
    if m == 4:  # one global scale per row, as merged projections hold them
        g = torch.rand(n, device=DEV) * 0.02 + 0.001
    ref = reference(x, w, s, g)
    for cfg in [nvfp4_config(m, n, k, x.device)] + nvfp4_candidates(n, k, x.device)[::7]:
        check(nvfp4_gemm(x, w, s, g, cfg), ref, torch.bfloat16)


@pytest.mark.gpu
def test_graph_replay_bit_identical_gpu():
    n, k, m = 4096, 4096, 4
    _, w, s, g = make(m, n, k, torch.bfloat16, seed=3)
    cfg = nvfp4_config(m, n, k, w.device)
    assert cfg.split_k > 1
    # fed by the RMSNorm kernel inside the graph: a PDL producer, as in a layer
    from dlrt.kernels.rms_norm import rms_norm

    norm_w = torch.rand(k, device=DEV, dtype=torch.bfloat16) + 0.5
    assert_replay_matches_eager(lambda x: nvfp4_gemm(rms_norm(x, norm_w, 1e-6), w, s, g, cfg),
                                (m, k))


# --- sm_90 code (compiled on the CPU) ----------------------------------------------------------

def _compile(out: Path) -> None:
    from dlrt.kernels.nvfp4_gemm import _nvfp4_gemm_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*fp8e4nv", g_ptr="*fp32", y_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32")
    consts = dict(K=4096, BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=2, FUSED=True,
                  ROW_SCALE=True,
                  PRECISION="tf32", PDL=True)
    ptx = compile_sm90(_nvfp4_gemm_kernel, sig, consts, num_stages=4, num_warps=4)
    (out / "nvfp4.ptx").write_text(ptx)


@pytest.fixture(scope="module")
def ptx(tmp_path_factory) -> list[str]:
    return body((ptx_folder(tmp_path_factory, __file__, "nvfp4ptx") / "nvfp4.ptx").read_text())


def test_sm90_code(ptx):
    wait = min(i for i, ln in enumerate(ptx) if ln.startswith("griddepcontrol.wait"))
    release = min(i for i, ln in enumerate(ptx) if ln.startswith("griddepcontrol.launch"))
    loads = global_loads(ptx)
    math = [i for i, ln in enumerate(ptx) if re.match(r"(mma|wgmma)\.", ln)]
    assert loads and min(loads) > wait, "a global load before the PDL wait"
    assert math and max(math) < release, "the dependent is released inside the main loop"
    assert not [ln for ln in ptx if ln.startswith("ld.const")]  # decoded, not looked up
    # bf16 x: fp16 operands; the tile is never widened to fp32 nor narrowed to bf16
    mma = [ptx[i] for i in math if re.match(r"(wgmma\.mma_async|mma\.sync)", ptx[i])]
    assert mma and all(".f16.f16" in ln for ln in mma), mma[:2]
    assert not [ln for ln in ptx if re.match(r"cvt\.(rn\.)?(f32\.f16|bf16\.f16)", ln)]


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
