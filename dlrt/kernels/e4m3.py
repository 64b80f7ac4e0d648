"""FP32 -> float8_e4m3fn codes inside a Triton kernel, bit for bit as PyTorch rounds.

`quantize_e4m3(x, scale)` is the device side of `dlrt.ops.reference.quantize_kv`:
clamp(x / scale, -448, 448) (an IEEE division, `div_rn`) rounded to nearest even, returned as
uint8 codes to store through a uint8 view of the FP8 tensor. The rounding is done on the fp32
bits rather than by a cast: Triton's interpreter rounds ties away and does not carry into the
exponent, so a cast would not be tested on the CPU; integer adds and shifts are exact on both.

e4m3 (bias 7, no infinities): a normal code holds exponent e in 1..15 and 3 mantissa bits,
value 2^(e-7) * (1 + m/8) for |x| >= 2^-6; codes 0..7 are the subnormals k * 2^-9, and code 8
is 2^-6, so for |x| < 2^-6 the code is the integer k = round(|x| * 2^9).

`f16_rows` prepares the other operand of a dot with e4m3 tiles kept in fp16 (e4m3 -> fp16 is one
packed instruction per two values; e4m3 -> bf16 goes through fp16 and costs three per value).

`store_fp8_groups` is the W8A8 activation quantisation of `dlrt.kernels.fp8_gemm.quantize_x`
(per row and 128-column group) applied to values a kernel holds in registers, so the kernel
that produces an FP8 GEMM's input writes its codes and scales itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
QGROUP = 128  # columns per W8A8 activation scale (`store_fp8_groups`)
GROUP: tl.constexpr = tl.constexpr(QGROUP)


@triton.jit
def quantize_e4m3(x, scale):
    """uint8 e4m3 codes of clamp(x / scale, -448, 448), round to nearest even.

    x: fp32 tensor; scale: fp32 scalar, or a tensor broadcasting against x. Equals
    `(x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)` (NaN inputs
    excepted)."""
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
    bits = y.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) << 7
    mag = bits & 0x7FFFFFFF
    # normal: keep 3 of the 23 mantissa bits, round half to even (a carry bumps the exponent);
    # fp32 exponent E maps to e4m3 exponent E - 120
    kept = (mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20
    normal = kept - (120 << 3)
    # subnormal: |y| * 2^9 (exact) rounded to an integer by adding and removing 2^23
    t = tl.abs(y) * 512.0
    sub = ((t + 8388608.0) - 8388608.0).to(tl.uint32)
    code = tl.where(mag >= (121 << 23), normal, sub)
    return (code | sign).to(tl.uint8)


@triton.jit
def store_fp8_groups(v, q_ptr, s_ptr, row, start, n):
    """Quantise a piece of row `row` of an [N, n] activation per 128-column group and store
    its codes and scales.

    v: fp32 [B] (B a multiple of 128), the values of columns start .. start + B - 1, 0 where
    the column is >= n (padding adds nothing to a group's amax); start a multiple of 128.
    Per group s = amax(|v|) / 448 (IEEE division; 1 where the amax is 0) and codes
    `quantize_e4m3(v, s)`, exactly as `dlrt.kernels.fp8_gemm.quantize_x`. Stores the codes
    (uint8) into q_ptr, row-major [N, n] (the columns < n), and the scales (fp32) into s_ptr,
    row-major [N, ceil(n / 128)] (the groups < ceil(n / 128))."""
    B: tl.constexpr = v.shape[0]
    G: tl.constexpr = B // GROUP
    groups = tl.reshape(v, (G, GROUP))
    amax = tl.max(tl.abs(groups), axis=1)
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, FP8_MAX), 1.0)
    codes = tl.reshape(quantize_e4m3(groups, scale[:, None]), (B,))
    cols = start + tl.arange(0, B)
    tl.store(q_ptr + row * n + cols, codes, mask=cols < n)
    n_groups = (n + GROUP - 1) // GROUP
    g = start // GROUP + tl.arange(0, G)
    tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)


@triton.jit
def f16_rows(a):
    """bf16 rows a [BLOCK_M, BLOCK_K] -> (a * 2^s in fp16, 2^-s fp32 [BLOCK_M]), s per row
    (|s| <= 126) putting the row's largest magnitude in [2^14, 2^15): a power-of-two scaling,
    so every value of the row at least 2^-28 of its largest is exact in fp16 (11 significant
    bits hold bf16's 8; smaller ones are rounded to a multiple of 2^-38 of the largest)."""
    af = a.to(tl.float32)
    amax = tl.max(tl.abs(af), axis=1)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2(amax)); 0: -127
    s = tl.minimum(tl.maximum(14 - e, -126), 126)
    up = ((s + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return (af * up[:, None]).to(tl.float16), down
