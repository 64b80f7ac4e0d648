"""Counter-based random numbers keyed by (seed, stream, round, position, column).

Pure int64 tensor arithmetic (a 32-bit integer hash, "lowbias32" by C. Wellons), so the same
key gives the same number in eager code, in a captured CUDA graph and on the CPU, with no
generator state to carry between rounds.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
SAMPLE_STREAM = 0  # Gumbel noise for token sampling
REMASK_STREAM = 1  # scores of the `random` strategy
RENOISE_STREAM = 2  # canvas tokens of renoising (uniform-state) decoding: first draw, renoises
# the largest fp32 below 1: (k + 0.5) / 2^24 rounds to 1.0 in fp32 for k = 2^24 - 1, where
# -log(u) would be 0 (an infinite race score)
BELOW_ONE = 1.0 - 2.0**-24


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Hash int64 values in [0, 2^32) to int64 values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def position_keys(seed, stream: int, round_idx, positions: torch.Tensor) -> torch.Tensor:
    """[n] int64 key in [0, 2^32) per position; column c's uniform hashes key + c * golden
    (`uniform` here, the same in `dlrt.kernels.sampling`). seed/round_idx: int or 0-d int64
    tensor."""
    s = torch.as_tensor(seed, dtype=torch.int64, device=positions.device)
    # NOTE: seeds below 2^32 hash as before; the high bits are folded in (mix32(0) == 0).
    k = mix32((s ^ mix32(s >> 32)) & _M32)
    k = mix32((k + stream * _GOLDEN) & _M32)
    k = mix32((k + round_idx) & _M32)
    return mix32((k + positions) & _M32)


def unit(h: torch.Tensor) -> torch.Tensor:
    """int64 hashes in [0, 2^32) to fp32 in (0, 1): (top 24 bits + 0.5) / 2^24 in fp32, at
    most `BELOW_ONE`."""
    return torch.clamp(((h >> 8).float() + 0.5) * (1.0 / (1 << 24)), max=BELOW_ONE)


def uniform(seed, stream: int, round_idx, positions: torch.Tensor, width: int) -> torch.Tensor:
    """Uniform floats in (0, 1), [n, width] fp32, one per (position, column) (`unit`)."""
    cols = torch.arange(width, dtype=torch.int64, device=positions.device)
    keys = position_keys(seed, stream, round_idx, positions)
    return unit(mix32((keys[:, None] + cols[None, :] * _GOLDEN) & _M32))
