"""The FP8 KV cache's PyTorch side: `quantize_kv` / `dequantize_kv` against a plain nearest-value
search over the e4m3 grid, and `PagedKVCache` storing and reading with per-layer scales.

Fresh random inputs (normal, log-uniform magnitudes, values past 448 * scale, every tie between
two e4m3 values); scales 1, 2 and 0.37. Tolerance of the round trip: half an e4m3 step, i.e.
relative error <= 2^-4 for |x / scale| in e4m3's normal range [2^-6, 448], absolute error
<= 2^-10 * scale below it; values beyond 448 * scale read back as +-448 * scale.
"""

from __future__ import annotations

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.ops.reference import FP8_MAX, dequantize_kv, quantize_kv

FP8 = torch.float8_e4m3fn
SLACK = 1 + 2**-16  # fp32 rounding of x / scale * scale


def e4m3_grid() -> tuple[torch.Tensor, torch.Tensor]:
    """(finite e4m3 values ascending as float64, their codes)."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(FP8).double()
    keep = torch.isfinite(values) & ~((values == 0) & (codes == 0x80))  # one zero
    order = values[keep].argsort()
    return values[keep][order], codes[keep][order]


def nearest_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Plain reference: the e4m3 value nearest to y (float64, already clamped), ties to the
    even code (mantissa's last bit 0)."""
    values, codes = e4m3_grid()
    hi = torch.searchsorted(values, y).clamp(1, values.numel() - 1)
    lo = hi - 1
    d_lo, d_hi = (y - values[lo]).abs(), (values[hi] - y).abs()
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    return torch.where(pick_hi, values[hi], values[lo])


def inputs(scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(4000, generator=gen) * 30 * scale
    log_uniform = torch.exp(torch.empty(4000).uniform_(-14, 8, generator=gen))
    log_uniform *= torch.where(torch.rand(4000, generator=gen) < 0.5, -1.0, 1.0) * scale
    values, _ = e4m3_grid()
    ties = ((values[1:] + values[:-1]) / 2).float() * scale
    beyond = torch.tensor([449.0, 500.0, 1e5, -464.0, -1e30]) * scale
    return torch.cat([normal, log_uniform, ties, beyond])


@pytest.mark.parametrize("scale", [1.0, 2.0, 0.37])
def test_quantize_is_the_nearest_e4m3_value(scale):
    x = inputs(scale, seed=int(scale * 100))
    s = torch.tensor(scale)
    q = quantize_kv(x, s)
    assert q.dtype == FP8 and q.shape == x.shape
    y = (x / s).double().clamp(-FP8_MAX, FP8_MAX)  # x / scale in fp32, as the op divides
    assert torch.equal(q.double(), nearest_e4m3(y))


@pytest.mark.parametrize("scale", [1.0, 2.0, 0.37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_error_is_half_an_e4m3_step(scale, dtype):
    x = inputs(scale, seed=7).to(dtype)
    s = torch.tensor(scale)
    back = dequantize_kv(quantize_kv(x, s), s, torch.float32).double()
    assert back.dtype == torch.float64 and torch.isfinite(back).all()
    want = x.double().clamp(-FP8_MAX * scale, FP8_MAX * scale)
    err = (back - want).abs() / SLACK
    normal = want.abs() >= 2**-6 * scale
    assert (err <= 2**-4 * want.abs())[normal].all()
    assert (err <= 2**-10 * scale)[~normal].all()
    clamped = x.double().abs() > FP8_MAX * scale * SLACK
    assert clamped.sum() >= 5
    torch.testing.assert_close(back[clamped].abs(), torch.full_like(back[clamped], 448 * scale))
    assert dequantize_kv(quantize_kv(x, s), s, dtype).dtype == dtype


def test_cache_stores_fp8_with_per_layer_scales():
    k_scale, v_scale = torch.tensor([1.0, 2.0, 0.37]), torch.tensor([0.5, 1.0, 4.0])
    cache = PagedKVCache(3, 2, 16, 40, FP8, "cpu", page_size=16, k_scale=k_scale,
                         v_scale=v_scale)
    assert cache.quantized and cache.k.dtype == FP8 and cache.nbytes == 2 * 3 * 48 * 2 * 16
    assert cache.k_scale.data_ptr() % 16 == 0 and cache.k_scale.stride() == (4,)
    gen = torch.Generator().manual_seed(3)
    positions = torch.tensor([0, 5, 17, 33, 39])  # across pages, ending inside one
    k = torch.randn(5, 2, 16, generator=gen) * 3
    v = torch.randn(5, 2, 16, generator=gen) * 3
    for layer in range(3):
        cache.write(layer, positions, k, v)
        slots = cache.slots(positions)
        stored_k = cache.k[layer].view(-1, 2, 16)[slots]
        stored_v = cache.v[layer].view(-1, 2, 16)[slots]
        assert torch.equal(stored_k.view(torch.uint8),
                           quantize_kv(k, k_scale[layer]).view(torch.uint8))
        assert torch.equal(stored_v.view(torch.uint8),
                           quantize_kv(v, v_scale[layer]).view(torch.uint8))
        rk, rv = cache.read(layer, 40, torch.bfloat16)
        assert rk.dtype == torch.bfloat16 and rk.shape == (40, 2, 16)
        torch.testing.assert_close(rk[positions].float(),
                                   (stored_k.float() * k_scale[layer]).bfloat16().float())
        assert not rv[1:5].any()  # unwritten slots read as zeros
    # scale 2: the stored value is half the input (a power of two: exact when representable)
    one = torch.full((1, 2, 16), 3.0)
    cache.write(1, torch.tensor([2]), one, one)
    assert (cache.k[1].view(-1, 2, 16)[2].float() == 1.5).all()
    assert (cache.v[1].view(-1, 2, 16)[2].float() == 3.0).all()


def test_cache_scale_errors():
    with pytest.raises(ValueError, match="one scale per layer"):
        PagedKVCache(2, 1, 16, 16, FP8, "cpu", k_scale=torch.ones(3))
    with pytest.raises(ValueError, match="only for an FP8 cache"):
        PagedKVCache(2, 1, 16, 16, torch.float32, "cpu", k_scale=torch.ones(2))
    plain = PagedKVCache(2, 1, 16, 16, torch.float32, "cpu")
    assert plain.scales(0) == (None, None) and not plain.quantized
    assert plain.nbytes == 2 * 2 * 16 * 16 * 4
