"""Weight-streaming GEMM on block-scaled FP8 weights for the few rows of a round.

    y[M, N] = x[M, K] @ dequant(w)^T,   dequant(w)[n, k] = w[n, k] * scale_inv[n // 128, k // 128]

Weight layout (Hugging Face / DeepSeek-V3 "fp8", `weight_block_size` [128, 128]):
  w          float8_e4m3fn [N, K], row-major (K contiguous);
  scale_inv  float32 [ceil(N / 128), ceil(K / 128)], row-major: the multiplier of each
             128 x 128 block (the last block row / column may be partial);
             or float32 [N, 1]: one multiplier per weight row (output channel) for the whole
             of K (compressed-tensors' per-channel FP8, `dlrt.layers.quant.compressed_tensors`;
             the "dot" kernels only: dequant(w)[n, k] = w[n, k] * scale_inv[n, 0]).
x: [M, K] bf16, fp16 or fp32, contiguous, M <= 64 (`Fp8GemmConfig.max_rows`); y: [M, N] in
x.dtype. At M <= 16 the product is a pass over the weight, so bytes are its cost: one byte per
weight element plus 4 bytes per 16384 elements of scales.

The dot is computed transposed (y^T tile = w tile @ x tile^T): the weight tile is the
[BLOCK_N, BLOCK_K] A operand and the few rows of x the narrow B operand, so on sm_90 a
BLOCK_N >= 64 tile runs as a warpgroup MMA (wgmma m64n16k32 e4m3 for W8A8, m64n16k16 bf16
for weight-only at M <= 16; both operands K-major as the layouts store them) rather than as
mma.sync with x padded to 16 rows as the A operand.

Three kernels: two variants of the tensor-core ("dot") kernel (`Fp8GemmConfig.w8a8`) and a
GEMV (`Fp8GemmConfig.kind` "fma"):

- weight-only (w8a8=False): each program streams a [BLOCK_N, K / SPLIT_K] slab of `w`
  (software-pipelined by Triton, `stages` tiles deep) in [BLOCK_N, BLOCK_K] tiles, BLOCK_K
  dividing 128 so that a tile lies in one scale block column. The FP8 tile is converted in
  registers to x's dtype (exact: every e4m3 value is a bf16 / fp16 / fp32 value) and multiplied
  with the x tile on tensor cores (fp32 x: full-fp32 "ieee" dot) into a fresh fp32 partial sum;
  the partial sum of each K tile is scaled by its block's `scale_inv` (one value per column n,
  gathered from [BLOCK_N] scale entries) and added to the fp32 accumulator. For bf16 x the
  dot runs on fp16 operands instead (e4m3 -> fp16 is one packed instruction per two values,
  e4m3 -> bf16 three per value): each row of the x tile is scaled by a power of two into
  fp16's range (`dlrt.kernels.e4m3.f16_rows`: exact for all but values below 2^-28 of the
  row's largest in the tile) and the partial sum scaled back. Numerics: products
  are exact, sums are fp32, the scale is applied once per (K tile, n) in fp32 - the reference
  "dequantise to fp32, then matmul in fp32" differs by fp32 summation order only (relative
  ~1e-6 of the largest output in fp32; the bf16 output rounding dominates otherwise).
- W8A8 (w8a8=True, BLOCK_K = 128): each K tile of x is one 128-column group. A first small
  kernel (`quantize_x`, one program per row and group) quantises x per row (token) and group:
      s_x = amax(|x[m, group]|) / 448   (1 where the amax is 0; IEEE division),
      q   = e4m3(clamp(x / s_x, -448, 448))   (IEEE division, round to nearest even; under
            TRITON_INTERPRET rounded in fp32 arithmetic first, `exact_cast`),
  and writes the codes (e4m3 [M, K]) and scales (fp32 [M, ceil(K/128)]); the GEMM then loads
  them like any operand (both tiles streamed from shared memory by the pipeline: quantising
  inside the GEMM's loop, once per program and tile, ran at 0.2 of the copy bandwidth on an
  H200), with an fp8 x fp8 dot and fp32 accumulation per tile, scaled by s_x[m] * scale_inv[n] and
  added to the fp32 accumulator. Promoting every 128-element partial sum to an fp32
  accumulator in registers keeps the tensor cores' limited FP8 accumulation precision to one
  group. Numerics: equal to "quantise x as above, dequantise both, matmul in fp32" up to fp32
  summation order (the quantisation itself is bit-identical).
- GEMV (kind "fma", weight-only, M <= 4): `skinny_gemm`'s GEMV on FP8 weights. Each
  program owns BLOCK_N (dividing 128: one scale row) whole rows of `w`, keeps the next 1-4
  [BLOCK_N, BLOCK_K] tiles in flight (16-byte loads of 16 e4m3 values), converts the current
  one to fp32 and multiplies it on CUDA cores with x scaled by its block's `scale_inv` (one
  value per tile when BLOCK_K <= 128, else per column; x * s in fp32: one rounding per
  product more than the reference, relative ~1e-7), runs of 16 adjacent products summed
  inside a thread; one reduction over K at the end. K must be a multiple of BLOCK_K (N any).
  Under PDL its first weight tiles and scales are loaded before it waits for the producer of
  x.

Both "dot" variants: the N tile spans any number of scale rows (the scale is gathered per
column; per-channel scales are loaded once per program and applied per K tile as block scales
are), K need not be a multiple of 128 or of the K tile (the tail is masked), N any size
(masked), rows of x padded to BLOCK_M = max(16, next power of two of M) with masks. With
SPLIT_K > 1 the K tiles are dealt to SPLIT_K programs per N tile, whose fp32 partial sums the
last of them to finish adds in a fixed order (deterministic; `dlrt.kernels.split_k`). PDL
(`dlrt.kernels.pdl`): the kernel waits for its predecessor before its first load and releases
its dependent after its main loop, as the BF16 "dot" kernel does.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl, split_k
from dlrt.kernels.e4m3 import f16_rows
from dlrt.kernels.skinny_gemm import launch_gemv

QBLOCK = 128  # the weight's scale block (both dims) and the W8A8 activation group
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MAX_ROWS = 64
FMA_ROWS = 4  # the GEMV keeps one accumulator per row of x
VEC = 16  # the GEMV sums runs of VEC adjacent products inside a thread (16-byte e4m3 loads)
FP8 = torch.float8_e4m3fn
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Fp8GemmConfig:
    """Tiles of the FP8 GEMM: a program owns BLOCK_N output columns and 1/split_k of the K
    tiles; `warps` its warps; `w8a8` picks the variant. kind "dot": tensor-core tiles, `stages`
    Triton's pipeline depth; kind "fma" (weight-only, M <= 4, `gemv`): `stages` weight tiles
    loaded ahead (1-4)."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    stages: int = 4
    warps: int = 4
    w8a8: bool = False
    kind: str = "dot"

    def fits(self, n: int, k: int) -> bool:
        """Whether the config serves w [n, k]. "dot": power-of-two tiles, BLOCK_K dividing 128
        (and equal to it for W8A8, a tile being one activation group), at least 16 and 32 wide
        (tensor-core shapes), at least one K tile per split. "fma": weight-only, no split,
        BLOCK_N dividing 128 (one scale row per program), K a multiple of BLOCK_K, BLOCK_K a
        multiple of VEC, 1-4 tiles ahead."""
        pow2 = all(v > 0 and v & (v - 1) == 0 for v in (self.block_n, self.block_k))
        if not pow2 or n <= 0 or k <= 0 or self.split_k < 1 or self.warps < 1:
            return False
        if self.kind == "fma":
            return (not self.w8a8 and self.split_k == 1 and QBLOCK % self.block_n == 0
                    and k % self.block_k == 0 and self.block_k % VEC == 0
                    and self.stages in (1, 2, 3, 4))
        if self.kind != "dot" or self.block_n < 16 or self.block_k < 32 or QBLOCK % self.block_k:
            return False
        if self.w8a8 and self.block_k != QBLOCK:
            return False
        return self.split_k <= triton.cdiv(k, self.block_k) and self.stages >= 1

    def x_row(self) -> bool:
        """GEMV: every warp of the tile lies along K (32 threads of VEC e4m3 each), so x is
        read once per column, not once per weight row."""
        return self.block_k % (32 * VEC * self.warps) == 0

    def max_rows(self) -> int:
        """Rows one call serves. "dot": x is padded to a [max(16, pow2 >= M), BLOCK_K] tile,
        up to 64 (a round's block); at M <= 16 the call is a pass over the weight, beyond it
        the tile's dot work grows but the weight is still read once. "fma": 4 (one fp32
        accumulator per row of x)."""
        return FMA_ROWS if self.kind == "fma" else MAX_ROWS


def block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(max(m, 1)))


def _sms(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100 / H200


@functools.lru_cache(maxsize=1024)  # called per product when no config is given
def fp8_config(m: int, n: int, k: int, w8a8: bool = False,
               device: torch.device | None = None) -> Fp8GemmConfig:
    """The default config for x [m, k] and w [n, k]: 128-wide K tiles; N tiles of 64 columns
    (32 when that leaves fewer than one program per SM, 16 below that); split-K doubled (up to
    8) while the grid covers the GPU less than twice and every split keeps at least 4 K tiles.
    The load-time tuner or the benchmark may time `fp8_candidates` instead."""
    sms = _sms(device)
    bn = 64
    while bn > 16 and triton.cdiv(n, bn) < sms:
        bn //= 2
    tiles, split = triton.cdiv(k, QBLOCK), 1
    while triton.cdiv(n, bn) * split < 2 * sms and tiles >= 8 * split and split < 8:
        split *= 2
    warps = 8 if m > 32 else 4
    return Fp8GemmConfig(bn, QBLOCK, split, stages=4, warps=warps, w8a8=w8a8)


# (block_n, block_k, warps) of the GEMV: 16-64 weight bytes per thread and tile
# (tiles of at most 128 columns read one scale per tile; wider ones one per column)
GEMV_BLOCKS = ((16, 128, 2), (32, 128, 4), (8, 128, 1), (4, 512, 4), (8, 256, 4),
               (8, 512, 4), (8, 1024, 8), (16, 512, 8), (4, 2048, 4), (16, 1024, 8))
GEMV_AHEAD = (1, 2, 4)


def fp8_candidates(n: int, k: int, w8a8: bool = False, device: torch.device | None = None,
                   rows: int = 16, channel: bool = False) -> list[Fp8GemmConfig]:
    """Configs worth timing for w [n, k] at `rows` rows: "dot" with N tiles of 16-128, K tiles
    of 64 / 128 (128 only for W8A8), split-K 1 up to the one that covers the GPU twice, 3 or 4
    stages; weight-only at rows <= 4 also the "fma" GEMV configs whose K tile divides K
    (block scales only: `channel`, per-channel scales [N, 1], gets "dot" configs only)."""
    sms = _sms(device)
    out = []
    if not w8a8 and not channel and rows <= FMA_ROWS:
        out += [Fp8GemmConfig(bn, bk, 1, stages=ahead, warps=w, kind="fma")
                for bn, bk, w in GEMV_BLOCKS for ahead in GEMV_AHEAD if k % bk == 0]
    for bn in (16, 32, 64, 128):
        for bk in ((QBLOCK,) if w8a8 else (64, QBLOCK)):
            tiles, split = triton.cdiv(n, bn), 1
            splits = [1]
            while tiles * split < 2 * sms and triton.cdiv(k, bk) >= 8 * split and split < 8:
                split *= 2
                splits.append(split)
            for s in splits:
                for stages in (3, 4):
                    cfg = Fp8GemmConfig(bn, bk, s, stages=stages, warps=4, w8a8=w8a8)
                    if cfg.fits(n, k):
                        out.append(cfg)
    return out


@triton.jit
def _round_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32:
    normal values (|v| >= 2^-6) keep 3 mantissa bits (rounding the fp32 bits, carries into
    the exponent included); smaller values are multiples of 2^-9 (adding and subtracting
    1.5 * 2^14, whose fp32 ulp is 2^-9, on |v|), with v's sign: a negative value that rounds
    to zero gives -0.0, as the cast does."""
    bits = v.to(tl.int32, bitcast=True)
    tiny = (tl.abs(v) + 24576.0) - 24576.0
    tiny = tl.where(bits < 0, tiny * -1.0, tiny)  # the sign bit (-0.0 included)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # clear the low 20 bits
    return tl.where(tl.abs(v) < 0.015625, tiny, bits.to(tl.float32, bitcast=True))


@triton.jit
def _quant_x_kernel(x_ptr, q_ptr, xs_ptr, K: tl.constexpr, EXACT_CAST: tl.constexpr,
                    PDL: tl.constexpr):
    """Row pid 0, 128-column group pid 1 of x -> e4m3 codes and the group's scale (the W8A8
    activation quantisation of the module docstring)."""
    row = tl.program_id(0)
    g = tl.program_id(1)
    KB: tl.constexpr = (K + 128 - 1) // 128
    k = g * 128 + tl.arange(0, 128)
    k_ok = k < K
    pdl.wait(PDL)
    xf = tl.load(x_ptr + row * K + k, mask=k_ok, other=0.0).to(tl.float32)
    pdl.release(PDL)
    amax = tl.max(tl.abs(xf), axis=0)
    xs = tl.where(amax > 0.0, tl.div_rn(amax, 448.0), 1.0)
    q = tl.div_rn(xf, xs)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if EXACT_CAST:  # round first: the cast then only moves representable values
        q = _round_e4m3(q)
    tl.store(q_ptr + row * K + k, q.to(tl.float8e4nv), mask=k_ok)
    tl.store(xs_ptr + row * KB + g, xs)


@triton.jit
def _fp8_gemm_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, M, N,
                     K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FUSED: tl.constexpr,
                     W8A8: tl.constexpr, CHANNEL: tl.constexpr, PRECISION: tl.constexpr,
                     PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    KB: tl.constexpr = (K + 128 - 1) // 128  # scale columns
    TILES: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    PER_SPLIT: tl.constexpr = (TILES + SPLIT_K - 1) // SPLIT_K
    EVEN: tl.constexpr = (K % BLOCK_K == 0) and (TILES % SPLIT_K == 0)  # no K masks
    w_rows = w_ptr + n[:, None].to(tl.int64) * K
    s_rows = s_ptr + (n // 128) * KB
    x_rows = x_ptr + m[:, None] * K
    pdl.wait(PDL)
    if CHANNEL:  # one scale per weight row (output channel) for the whole of K
        ws = tl.load(s_ptr + n, mask=n_ok, other=0.0)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T: the weight tile is the dot's A
    for i in range(0, PER_SPLIT):
        t = pid_k * PER_SPLIT + i
        k = t * BLOCK_K + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0)
            x = tl.load(x_rows + k[None, :], mask=m_ok[:, None], other=0.0)
        else:
            k_ok = k < K
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # the tile's scale block column (clamped: a tile past K is all zeros)
        kb = tl.minimum((t * BLOCK_K) // 128, KB - 1)
        if not CHANNEL:
            ws = tl.load(s_rows + kb, mask=n_ok, other=0.0)
        if W8A8:  # x holds e4m3 codes (`_quant_x_kernel`), xs_ptr their group scales
            xs = tl.load(xs_ptr + m * KB + kb, mask=m_ok, other=1.0)
            part = tl.dot(w, tl.trans(x), out_dtype=tl.float32)
            acc += part * ws[:, None] * xs[None, :]
        elif x.dtype == tl.bfloat16:  # fp16 operands: see the module docstring
            x16, down = f16_rows(x)
            part = tl.dot(w.to(tl.float16), tl.trans(x16), out_dtype=tl.float32)
            acc += part * ws[:, None] * down[None, :]
        else:
            part = tl.dot(w.to(x.dtype), tl.trans(x), input_precision=PRECISION,
                          out_dtype=tl.float32)
            acc += part * ws[:, None]
    pdl.release(PDL)
    split_k.store_tile(acc, y_ptr, part_ptr, count_ptr, m[None, :] * N + n[:, None],
                       n_ok[:, None] & m_ok[None, :], pid_n, pid_k, BLOCK_M * N, SPLIT_K, FUSED)


def exact_cast(x: torch.Tensor) -> bool:
    """Round to e4m3 in fp32 arithmetic before the cast: under TRITON_INTERPRET, whose fp32 ->
    e4m3 cast drops the carry when rounding crosses a power of two (126.8 -> 64, not 128).
    On the GPU the cast (cvt.rn.satfinite) rounds correctly by itself."""
    return not x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def quantize_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The W8A8 activation quantisation: x [M, K] (bf16 / fp16 / fp32) -> (e4m3 codes
    float8_e4m3fn [M, K], scales float32 [M, ceil(K / 128)]), per row and 128-column group as
    the module docstring states. One small kernel (under PDL it overlaps x's producer)."""
    m, k = x.shape
    kb = triton.cdiv(k, QBLOCK)
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    xs = torch.empty((m, kb), dtype=torch.float32, device=x.device)
    if m:
        _quant_x_kernel[(m, kb)](x, q, xs, K=k, EXACT_CAST=exact_cast(x), num_warps=1,
                                 **pdl.launch_options(x))
    return q, xs


def _check_codes(x, k: int, device: torch.device):
    """(codes, scales, dtype) of a pre-quantised x; ValueError when they do not fit."""
    q, xs = x.q, x.scale
    m = q.shape[0] if q.dim() == 2 else -1
    if (q.dim() != 2 or q.dtype != FP8 or q.shape[1] != k or not q.is_contiguous()
            or tuple(xs.shape) != (m, triton.cdiv(k, QBLOCK)) or xs.dtype != torch.float32
            or not xs.is_contiguous() or q.device != device or xs.device != device
            or x.dtype not in X_DTYPES):
        raise ValueError(f"fp8_gemm: quantised x: codes {q.dtype} {tuple(q.shape)} and "
                         f"scales {xs.dtype} {tuple(xs.shape)} on {q.device} (for {x.dtype}) "
                         f"do not fit K={k} on {device}")
    return q, xs, x.dtype


def check_fp8_weight(w: torch.Tensor, scale_inv: torch.Tensor) -> tuple[int, int, bool]:
    """(N, K, per-channel) of an FP8 weight with block scales [ceil(N/128), ceil(K/128)] or
    per-channel scales [N, 1] (per-channel True; where both shapes agree, N = 1 and K <= 128,
    the two readings are the same product and the block one is taken); ValueError on a wrong
    dtype, shape or layout."""
    if w.dim() != 2 or w.dtype != FP8 or not w.is_contiguous():
        raise ValueError(f"fp8 weight must be contiguous float8_e4m3fn [N, K], got {w.dtype} "
                         f"{tuple(w.shape)}")
    n, k = w.shape
    blocks = (triton.cdiv(n, QBLOCK), triton.cdiv(k, QBLOCK))
    shape = tuple(scale_inv.shape)
    if (scale_inv.dtype != torch.float32 or shape not in (blocks, (n, 1))
            or not scale_inv.is_contiguous() or scale_inv.device != w.device):
        raise ValueError(f"scale_inv must be contiguous float32 {blocks} (128 x 128 blocks) or "
                         f"{(n, 1)} (per channel) on {w.device} for w [{n}, {k}], got "
                         f"{scale_inv.dtype} {shape} on {scale_inv.device}")
    return n, k, shape != blocks


def fp8_gemm(x, w: torch.Tensor, scale_inv: torch.Tensor,
             config: Fp8GemmConfig | None = None) -> torch.Tensor:
    """y = x @ (w * scale_inv per 128 x 128 block)^T (see the module docstring).

    Args:
        x: [M <= 64, K] bf16 / fp16 / fp32, contiguous; or x already quantised by the op that
            made it (an object with `q` e4m3 codes [M, K], `scale` fp32 [M, ceil(K/128)] as
            `quantize_x` writes them, and `dtype`, the activation's: `dlrt.ops.Fp8Activation`),
            for a W8A8 config only, which then skips `quantize_x`.
        w: [N, K] float8_e4m3fn, contiguous, on x's device.
        scale_inv: [ceil(N/128), ceil(K/128)] float32, contiguous (block scales); or [N, 1]
            float32 (per-channel scales; "dot" configs only).
        config: tiles and variant (`config.w8a8`: quantise x per token and 128-column group
            in the kernel; `config.kind` "fma": the GEMV, M <= 4, block scales only); None:
            `fp8_config(M, N, K)`, weight-only "dot".
    Returns:
        y: [M, N] in x.dtype, a new tensor (fp32 sums).
    Raises:
        ValueError: wrong shapes, dtypes, layouts or devices, or a config that does not fit.
    """
    n, k, channel = check_fp8_weight(w, scale_inv)
    codes = None
    if not isinstance(x, torch.Tensor):  # pre-quantised: codes and scales
        codes = _check_codes(x, k, w.device)
        if config is not None and not config.w8a8:
            raise ValueError(f"fp8_gemm: quantised x needs a W8A8 config, got {config}")
        config = config or fp8_config(x.q.shape[0], n, k, w8a8=True, device=w.device)
        x = x.q
    if x.dim() != 2 or x.shape[1] != k or not x.is_contiguous() or x.shape[0] > MAX_ROWS:
        raise ValueError(f"fp8_gemm: x {tuple(x.shape)} must be contiguous [M<={MAX_ROWS}, "
                         f"{k}] for w {tuple(w.shape)}")
    if codes is None and (x.dtype not in X_DTYPES or x.device != w.device):
        raise ValueError(f"fp8_gemm: x is {x.dtype} on {x.device}; it must be one of "
                         f"{X_DTYPES} on {w.device}")
    m = x.shape[0]
    config = config or fp8_config(m, n, k, device=x.device)
    if not config.fits(n, k) or (channel and config.kind == "fma"):
        why = " (the GEMV reads block scales only)" if channel and config.kind == "fma" else ""
        raise ValueError(f"fp8_gemm: {config} does not fit N={n}, K={k}{why}")
    if m > config.max_rows():
        raise ValueError(f"fp8_gemm: {config.kind!r} configs serve M<={config.max_rows()}, "
                         f"got M={m}")
    dtype = codes[2] if codes else x.dtype  # y's, the activation's
    y = torch.empty((m, n), dtype=dtype, device=x.device)
    if m == 0:
        return y
    if config.kind == "fma":
        launch_gemv(x, w, scale_inv, y, config, VEC)  # the skinny GEMV with block scales
        return y
    bm = block_m(m)
    opts = pdl.launch_options(x)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    part, count, fused = split_k.partials(y, config.split_k, bm, grid[0])
    xq, xs = x, y
    if codes:
        xq, xs = x, codes[1]
    elif config.w8a8:
        xq, xs = quantize_x(x)
    _fp8_gemm_kernel[grid](xq, xs, w, scale_inv, y, part, count, m, n, K=k, BLOCK_M=bm,
                           BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                           SPLIT_K=config.split_k, FUSED=fused, W8A8=config.w8a8,
                           CHANNEL=channel,
                           PRECISION="ieee" if dtype == torch.float32 else "tf32",
                           num_stages=config.stages, num_warps=config.warps, **opts)
    return split_k.finish(part, y, config.split_k, bm, fused, opts)
