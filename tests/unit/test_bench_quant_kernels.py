"""The weights `dlrt.bench.quant_kernels` times (on the CPU): the layers' formats, in the
layouts the kernels read, and the kernels (under the interpreter) reproduce the dequantised
products."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.bench.quant_kernels import dequantised, held_weights  # noqa: E402
from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm  # noqa: E402
from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig, nvfp4_gemm  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_fp8_weights_and_kernel():
    w = torch.randn(130, 272, generator=torch.Generator().manual_seed(0)) * 0.02
    held = held_weights(w)
    assert "nvfp4" in held and set(held) == {"bf16", "fp8", "nvfp4"}
    q, s = held["fp8"]
    assert q.dtype == torch.float8_e4m3fn and q.shape == (130, 272) and s.shape == (2, 3)
    d = dequantised("fp8", held["fp8"])
    assert rel(d, w) < 0.07  # e4m3: 3 mantissa bits, per-block amax scaled
    x = torch.randn(3, 272)
    assert rel(fp8_gemm(x, q, s, Fp8GemmConfig(32, 128, 2)), x @ d.T) < 1e-5


def test_nvfp4_weights_and_kernel():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(1)) * 0.02
    w[0, :16] = torch.tensor([6.0, -1.0] * 8) * 1e-3
    p, s, g = held_weights(w)["nvfp4"]
    assert p.dtype == torch.uint8 and p.shape == (40, 48) and s.shape == (40, 6)
    assert g.shape == (1,)
    d = dequantised("nvfp4", (p, s, g))
    assert rel(d, w) < 0.25  # e2m1: values 4 and 6 are a third apart
    assert int(p[0, 0]) & 15 == 7 and int(p[0, 0]) >> 4 == 8 + 2  # 6 low, -1 high
    x = torch.randn(3, 96)
    y = nvfp4_gemm(x, p, s, g, Nvfp4GemmConfig(16, 64, 1))
    assert rel(y, x @ d.T) < 1e-5


def test_no_nvfp4_when_k_is_not_a_multiple_of_16():
    assert set(held_weights(torch.randn(8, 40))) == {"bf16", "fp8"}
