"""`rng.unit` maps every 32-bit hash into (0, 1) in fp32: (k + 0.5) / 2^24 rounds to 1.0 for
the top k = 2^24 - 1, where a race's -log(u) would be 0; the Triton kernels' `race_uniform`
clamps the same way (under TRITON_INTERPRET=1 on the CPU)."""

import pytest
import torch

from dlrt.decoding import rng

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dlrt.kernels.sampling import race_uniform  # noqa: E402


@triton.jit
def _uniforms(keys_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + i, mask=i < n, other=0).to(tl.uint32)
    tl.store(out_ptr + i, race_uniform(key, tl.zeros([BLOCK], tl.int32)), mask=i < n)


def test_every_top_value_stays_below_one():
    top = torch.arange((1 << 24) - 4096, 1 << 24, dtype=torch.int64) << 8 | 0xFF
    u = rng.unit(top)
    assert u.dtype == torch.float32 and float(u.max()) == rng.BELOW_ONE < 1.0
    assert bool((-torch.log(u) > 0).all())
    assert float(rng.unit(torch.tensor([0]))) == 0.5 / (1 << 24)


def unmix32(h: int) -> int:
    """The key whose `rng.mix32` is h (each step of the hash inverted)."""
    m = (1 << 32) - 1
    h ^= h >> 16
    h = h * pow(0x846CA68B, -1, 1 << 32) & m
    h ^= (h >> 15) ^ (h >> 30)
    h = h * pow(0x7FEB352D, -1, 1 << 32) & m
    return h ^ (h >> 16)


def test_the_kernels_uniform_is_the_same():
    top = [unmix32(0xFFFFFF00 | low) for low in (0x00, 0x7F, 0xFF)]  # hashes that round to 1.0
    assert [int(rng.mix32(torch.tensor(k))) >> 8 for k in top] == [(1 << 24) - 1] * 3
    keys = torch.tensor(top + list(range(61)), dtype=torch.int64)
    out = torch.empty(len(keys), dtype=torch.float32, device="cuda" if torch.cuda.is_available()
                      else "cpu")
    _uniforms[(1,)](keys.to(torch.uint32).to(out.device), out, len(keys), BLOCK=64)
    assert torch.equal(out.cpu(), rng.unit(rng.mix32(keys)))
    assert float(out.max()) < 1.0
