"""The quantisers of `dlrt.bench.quant_kernels` (on the CPU): they write the layouts the
kernels read, and the kernels (under the interpreter) reproduce the dequantised products."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.bench.quant_kernels import (  # noqa: E402
    dequant_fp8,
    dequant_nvfp4,
    quantise_fp8,
    quantise_nvfp4,
)
from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm  # noqa: E402
from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig, nvfp4_gemm  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_fp8_quantiser_layout_and_kernel():
    w = torch.randn(130, 272, generator=torch.Generator().manual_seed(0)) * 0.02
    q, s = quantise_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (130, 272) and s.shape == (2, 3)
    assert rel(dequant_fp8(q, s), w) < 0.07  # e4m3: 3 mantissa bits, per-block amax scaled
    x = torch.randn(3, 272)
    assert rel(fp8_gemm(x, q, s, Fp8GemmConfig(32, 128, 2)), x @ dequant_fp8(q, s).T) < 1e-5


def test_nvfp4_quantiser_layout_and_kernel():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(1)) * 0.02
    p, s, g = quantise_nvfp4(w)
    assert p.dtype == torch.uint8 and p.shape == (40, 48) and s.shape == (40, 6)
    d = dequant_nvfp4(p, s, g)
    assert rel(d, w) < 0.25  # e2m1: values 4 and 6 are a third apart
    # the low nibble is element 2j: its dequantised value is nearest to w[:, 2j]
    w[0, :16] = torch.tensor([6.0, -1.0] * 8) * 1e-3
    p, s, g = quantise_nvfp4(w)
    assert int(p[0, 0]) & 15 == 7 and int(p[0, 0]) >> 4 == 8 + 2  # 6 low, -1 high
    x = torch.randn(3, 96)
    y = nvfp4_gemm(x, p, s, g, Nvfp4GemmConfig(16, 64, 1))
    assert rel(y, x @ dequant_nvfp4(p, s, g).T) < 1e-5
