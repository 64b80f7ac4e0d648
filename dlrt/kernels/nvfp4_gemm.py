"""Weight-streaming GEMM on NVFP4 weights (weight-only) for the few rows of a round.

    y[M, N] = x[M, K] @ dequant(w)^T,
    dequant(w)[n, k] = e2m1(w[n, k]) * float(w_scale[n, k // 16]) * global_scale (or [n])

Weight layout (NVIDIA ModelOpt "NVFP4" export; dlrt's loaders write the same):
  w             uint8 [N, K / 2], row-major: two FP4 e2m1 values per byte, the LOW nibble
                (bits 0-3) holds element 2j and the HIGH nibble (bits 4-7) element 2j + 1 of
                byte j. A nibble is sign (bit 3), exponent (bits 1-2), mantissa (bit 0):
                magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0-7, codes 8-15 their negatives.
  w_scale       float8_e4m3fn [N, ceil(K / 16)], row-major (linear, not the swizzled layout
                of CUTLASS kernels): one multiplier per 16 consecutive elements of a row.
  global_scale  float32 on the device, one element (ModelOpt's `weight_scale_2`: a multiplier
                of the whole weight) or [N] (one per row: merged projections whose parts
                carry different global scales, as dlrt's layers hold them); read by the kernel
                (no host sync; graph-safe).
x: [M, K] bf16, fp16 or fp32, contiguous, K even, M <= 64; y: [M, N] in x.dtype. At M <= 16
the product is a pass over the weight: 0.5 byte per element plus 1 byte per 16 of scales.

Kernel: each program streams a [BLOCK_N, K / SPLIT_K] slab of `w` in tiles of BLOCK_K
elements (BLOCK_K / 2 bytes) per row, loaded as [BLOCK_N, BLOCK_K / 16, 8] bytes so that each
row of 8 bytes (16 elements) meets its scale without a gather. Each nibble is decoded in
registers by bit moves: its sign and 3 magnitude bits placed into an fp16 bit pattern give
e2m1 * 2^-14 exactly (code 1, 0.5, becomes the fp16 subnormal 2^-15; no lookup, no branch),
widened to fp32 and multiplied by w_scale * 2^14. That product (a 2-bit by a 4-bit
significand) is exact in bf16 / fp16 / fp32, so the dequantised tile in x's dtype is exact.
For bf16 x the tile stays in fp16 instead: e2m1 * 2^-14 times w_scale (converted by packed
e4m3x2 -> f16x2 instructions) is exact in fp16 too (a multiple of 2^-24, below 0.17), so no
value is widened or narrowed; x's even and odd columns are scaled per row by powers of two
into fp16's range (`dlrt.kernels.e4m3.f16_rows`: exact for all but values below 2^-28 of
the row's largest in the tile), and the fp16 dots' sums scaled back by 2^14 and those
powers.
The even elements (low nibbles) and odd elements (high nibbles) form two [BLOCK_N,
BLOCK_K / 2] tiles, multiplied with the even and odd columns of x on tensor cores (transposed,
as in `dlrt.kernels.fp8_gemm`: the weight is the A operand; fp32 x: full-fp32 dot), summed
in fp32; global_scale (per row) multiplies the fp32 accumulator once at the end. Numerics: exact
products, fp32 sums: the reference "dequantise to fp32 (exact), matmul in fp32" differs by
summation order only. K need not be a multiple of the tile or of 16 (masked tails), N any
size. Split-K, its deterministic reduction and PDL as in the FP8 and BF16 GEMMs.
Decoding costs ~8 integer / conversion operations per weight element on CUDA cores: at a
few rows this (not HBM) may bound the kernel on sm_90, which has no FP4 conversion
instruction; the benchmark (`dlrt.bench.quant_kernels`) measures it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl, split_k
from dlrt.kernels.e4m3 import f16_rows

GROUP = 16  # elements per w_scale entry
MAX_ROWS = 64
FP8 = torch.float8_e4m3fn
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# e2m1 magnitudes of codes 0-7 (codes 8-15: the same, negative)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Nvfp4GemmConfig:
    """Tiles of the NVFP4 GEMM: a program owns BLOCK_N output columns and 1/split_k of the K
    tiles of BLOCK_K elements; `stages` is Triton's pipeline depth."""

    block_n: int = 64
    block_k: int = 256
    split_k: int = 1
    stages: int = 4
    warps: int = 4

    def fits(self, n: int, k: int) -> bool:
        """Whether the config serves a weight of n rows and k (even) elements per row:
        power-of-two tiles, BLOCK_N >= 16 and BLOCK_K >= 32 (each half-tile a dot of depth
        >= 16), at least one K tile per split."""
        pow2 = all(v > 0 and v & (v - 1) == 0 for v in (self.block_n, self.block_k))
        if not pow2 or n <= 0 or k <= 0 or k % 2 or self.split_k < 1 or self.warps < 1:
            return False
        if self.block_n < 16 or self.block_k < 32 or self.stages < 1:
            return False
        return self.split_k <= triton.cdiv(k, self.block_k)

    def max_rows(self) -> int:
        return MAX_ROWS


def _sms(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@functools.lru_cache(maxsize=1024)  # called per product when no config is given
def nvfp4_config(m: int, n: int, k: int,
                 device: torch.device | None = None) -> Nvfp4GemmConfig:
    """The default config: 256-element (128-byte) K tiles, N tiles of 64 (down to 16 while
    that leaves fewer than one program per SM), split-K doubled (up to 8) while the grid covers
    the GPU less than twice and each split keeps at least 4 K tiles."""
    sms = _sms(device)
    bn, bk = 64, 256
    while bn > 16 and triton.cdiv(n, bn) < sms:
        bn //= 2
    tiles, split = triton.cdiv(k, bk), 1
    while triton.cdiv(n, bn) * split < 2 * sms and tiles >= 8 * split and split < 8:
        split *= 2
    return Nvfp4GemmConfig(bn, bk, split, stages=4, warps=8 if m > 32 else 4)


def nvfp4_candidates(n: int, k: int, device: torch.device | None = None
                     ) -> list[Nvfp4GemmConfig]:
    """Configs worth timing: N tiles of 16-128, K tiles of 128 / 256 elements, split-K up to
    covering the GPU twice, 3 or 4 stages with 4 warps, 4 stages with 8. (With 512-element K
    tiles too, 78-111 configs per SDAR-8B shape, the load-time plan of an SDAR-8B NVFP4 load
    did not finish within 150 s on an H200; whether those tiles would win is unmeasured.)"""
    sms = _sms(device)
    out = []
    for bn in (16, 32, 64, 128):
        for bk in (128, 256):
            split, splits = 1, [1]
            while (triton.cdiv(n, bn) * split < 2 * sms and triton.cdiv(k, bk) >= 8 * split
                   and split < 8):
                split *= 2
                splits.append(split)
            for s in splits:
                for stages, warps in ((3, 4), (4, 4), (4, 8)):
                    cfg = Nvfp4GemmConfig(bn, bk, s, stages=stages, warps=warps)
                    if cfg.fits(n, k):
                        out.append(cfg)
    return out


@triton.jit
def _e2m1(p):
    """Packed bytes (uint8) -> the values * 2^-14 in fp16 of their low and high nibbles'
    e2m1 codes, exactly. Each code's sign goes to fp16 bit 15, its exponent and mantissa to
    fp16 bits 9-11 (exponent field e, mantissa's top bit m: 2^(e-15) * (1 + m/2), or the
    subnormal m * 2^-15 for e = 0), straight from the byte: no nibble is extracted first."""
    v = p.to(tl.uint16)
    lo = ((v & 0x08) << 12) | ((v & 0x07) << 9)
    hi = ((v & 0x80) << 8) | ((v & 0x70) << 5)
    return lo.to(tl.float16, bitcast=True), hi.to(tl.float16, bitcast=True)


@triton.jit
def _nvfp4_gemm_kernel(x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, part_ptr, count_ptr, M, N,
                       K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FUSED: tl.constexpr,
                       ROW_SCALE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    KP: tl.constexpr = K // 2  # bytes per weight row
    KS: tl.constexpr = (K + 16 - 1) // 16  # scales per weight row
    G: tl.constexpr = BLOCK_K // 16  # scale groups per tile
    HALF: tl.constexpr = BLOCK_K // 2  # bytes per tile row
    TILES: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    PER_SPLIT: tl.constexpr = (TILES + SPLIT_K - 1) // SPLIT_K
    EVEN: tl.constexpr = (K % BLOCK_K == 0) and (TILES % SPLIT_K == 0)  # no K masks
    g = tl.arange(0, G)
    byte = g[:, None] * 8 + tl.arange(0, 8)[None, :]  # [G, 8]: byte of the tile
    j = tl.arange(0, HALF)  # byte j of the tile holds elements 2j, 2j + 1
    w_rows = w_ptr + n[:, None, None].to(tl.int64) * KP
    s_rows = s_ptr + n[:, None].to(tl.int64) * KS
    x_rows = x_ptr + m[:, None] * K
    pdl.wait(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T: the weight tile is the dot's A
    for i in range(0, PER_SPLIT):
        t = pid_k * PER_SPLIT + i
        kp = t * HALF + byte  # [G, 8]
        ks = t * G + g  # [G]
        xc = t * BLOCK_K + 2 * j  # [HALF]: the even column of byte j
        if EVEN:
            p = tl.load(w_rows + kp[None, :, :], mask=n_ok[:, None, None], other=0)
            sc = tl.load(s_rows + ks[None, :], mask=n_ok[:, None], other=0.0)
            x_even = tl.load(x_rows + xc[None, :], mask=m_ok[:, None], other=0.0)
            x_odd = tl.load(x_rows + xc[None, :] + 1, mask=m_ok[:, None], other=0.0)
        else:
            p = tl.load(w_rows + kp[None, :, :], mask=n_ok[:, None, None] & (kp < KP)[None, :, :],
                        other=0)
            sc = tl.load(s_rows + ks[None, :], mask=n_ok[:, None] & (ks < KS)[None, :],
                         other=0.0)
            x_ok = m_ok[:, None] & (xc < K)[None, :]  # K is even: the odd column too
            x_even = tl.load(x_rows + xc[None, :], mask=x_ok, other=0.0)
            x_odd = tl.load(x_rows + xc[None, :] + 1, mask=x_ok, other=0.0)
        lo, hi = _e2m1(p)
        if x_even.dtype == tl.bfloat16:  # fp16 operands (module docstring)
            s16 = sc.to(tl.float16)[:, :, None]
            lo = tl.reshape(lo * s16, [BLOCK_N, HALF])  # e2m1 * w_scale * 2^-14, exact
            hi = tl.reshape(hi * s16, [BLOCK_N, HALF])
            xe, de = f16_rows(x_even)
            xo, do = f16_rows(x_odd)
            acc += tl.dot(lo, tl.trans(xe), out_dtype=tl.float32) * (de * 16384.0)[None, :]
            acc += tl.dot(hi, tl.trans(xo), out_dtype=tl.float32) * (do * 16384.0)[None, :]
        else:
            scale = (sc.to(tl.float32) * 16384.0)[:, :, None]  # undoes _e2m1's 2^-14
            lo = tl.reshape(lo.to(tl.float32) * scale, [BLOCK_N, HALF]).to(x_even.dtype)
            hi = tl.reshape(hi.to(tl.float32) * scale, [BLOCK_N, HALF]).to(x_even.dtype)
            acc += tl.dot(lo, tl.trans(x_even), input_precision=PRECISION,
                          out_dtype=tl.float32)
            acc += tl.dot(hi, tl.trans(x_odd), input_precision=PRECISION,
                          out_dtype=tl.float32)
    pdl.release(PDL)
    if ROW_SCALE:  # one global scale per weight row
        acc = acc * tl.load(g_ptr + n, mask=n_ok, other=0.0)[:, None]
    else:
        acc = acc * tl.load(g_ptr)
    split_k.store_tile(acc, y_ptr, part_ptr, count_ptr, m[None, :] * N + n[:, None],
                       n_ok[:, None] & m_ok[None, :], pid_n, pid_k, BLOCK_M * N, SPLIT_K, FUSED)


def check_nvfp4_weight(w: torch.Tensor, w_scale: torch.Tensor, global_scale: torch.Tensor,
                       k: int) -> int:
    """N of an NVFP4 weight of k elements per row; ValueError on a wrong dtype, shape, layout
    or device."""
    if w.dim() != 2 or w.dtype != torch.uint8 or not w.is_contiguous() or k % 2:
        raise ValueError(f"nvfp4 weight must be contiguous uint8 [N, K/2] with K even, got "
                         f"{w.dtype} {tuple(w.shape)} for K={k}")
    n = w.shape[0]
    if w.shape[1] * 2 != k:
        raise ValueError(f"nvfp4 weight {tuple(w.shape)} does not hold K={k} elements per row")
    shape = (n, triton.cdiv(k, GROUP))
    if (w_scale.dtype != FP8 or tuple(w_scale.shape) != shape or not w_scale.is_contiguous()
            or w_scale.device != w.device):
        raise ValueError(f"w_scale must be contiguous float8_e4m3fn {shape} on {w.device}, got "
                         f"{w_scale.dtype} {tuple(w_scale.shape)} on {w_scale.device}")
    if (global_scale.dtype != torch.float32 or global_scale.numel() not in (1, n)
            or not global_scale.is_contiguous() or global_scale.device != w.device):
        raise ValueError(f"global_scale must be one or {n} contiguous float32 on {w.device}, got "
                         f"{global_scale.dtype} {tuple(global_scale.shape)} on "
                         f"{global_scale.device}")
    return n


def nvfp4_gemm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
               global_scale: torch.Tensor,
               config: Nvfp4GemmConfig | None = None) -> torch.Tensor:
    """y = x @ dequant(w)^T for an NVFP4 weight (see the module docstring).

    Args:
        x: [M <= 64, K] bf16 / fp16 / fp32, contiguous, K even.
        w: [N, K/2] uint8, contiguous: element 2j in the low nibble of byte j, 2j+1 high.
        w_scale: [N, ceil(K/16)] float8_e4m3fn, contiguous.
        global_scale: float32 on x's device: one element, or [N] (one per row).
        config: tiles; None: `nvfp4_config(M, N, K)`.
    Returns:
        y: [M, N] in x.dtype, a new tensor (fp32 sums).
    Raises:
        ValueError: wrong shapes, dtypes, layouts or devices, or a config that does not fit.
    """
    if x.dim() != 2 or not x.is_contiguous() or x.shape[0] > MAX_ROWS:
        raise ValueError(f"nvfp4_gemm: x {tuple(x.shape)} must be contiguous [M<={MAX_ROWS}, K]")
    if x.dtype not in X_DTYPES or x.device != w.device:
        raise ValueError(f"nvfp4_gemm: x is {x.dtype} on {x.device}; it must be one of "
                         f"{X_DTYPES} on {w.device}")
    m, k = x.shape
    n = check_nvfp4_weight(w, w_scale, global_scale, k)
    config = config or nvfp4_config(m, n, k, device=x.device)
    if not config.fits(n, k):
        raise ValueError(f"nvfp4_gemm: {config} does not fit N={n}, K={k}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bm = max(16, triton.next_power_of_2(m))
    opts = pdl.launch_options(x)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    part, count, fused = split_k.partials(y, config.split_k, bm, grid[0])
    _nvfp4_gemm_kernel[grid](x, w, w_scale, global_scale, y, part, count, m, n, K=k,
                             BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                             SPLIT_K=config.split_k, FUSED=fused,
                             ROW_SCALE=global_scale.numel() != 1,
                             PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                             num_stages=config.stages, num_warps=config.warps, **opts)
    return split_k.finish(part, y, config.split_k, bm, fused, opts)
