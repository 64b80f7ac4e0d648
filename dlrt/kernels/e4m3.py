"""FP32 -> float8_e4m3fn codes inside a Triton kernel, bit for bit as PyTorch rounds.

`quantize_e4m3(x, scale)` is the device side of `dlrt.ops.reference.quantize_kv`:
clamp(x / scale, -448, 448) (an IEEE division, `div_rn`) rounded to nearest even, returned as
uint8 codes to store through a uint8 view of the FP8 tensor. The rounding is done on the fp32
bits rather than by a cast: Triton's interpreter rounds ties away and does not carry into the
exponent, so a cast would not be tested on the CPU; integer adds and shifts are exact on both.

e4m3 (bias 7, no infinities): a normal code holds exponent e in 1..15 and 3 mantissa bits,
value 2^(e-7) * (1 + m/8) for |x| >= 2^-6; codes 0..7 are the subnormals k * 2^-9, and code 8
is 2^-6, so for |x| < 2^-6 the code is the integer k = round(|x| * 2^9).
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX: tl.constexpr = tl.constexpr(448.0)


@triton.jit
def quantize_e4m3(x, scale):
    """uint8 e4m3 codes of clamp(x / scale, -448, 448), round to nearest even.

    x: fp32 tensor; scale: fp32 scalar. Equals `(x / scale).clamp(-448, 448)
    .to(torch.float8_e4m3fn).view(torch.uint8)` (NaN inputs excepted)."""
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
