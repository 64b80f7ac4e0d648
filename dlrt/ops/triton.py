"""The ops as dlrt's Triton kernels (`dlrt.kernels`), with the numerics of `dlrt.ops.reference`.

Each takes what its kernel takes (contiguous 2-D activations); the round's candidates come
straight from the logits: greedy (`dlrt.kernels.greedy`) or sampled with the request's values
read from device memory (`dlrt.kernels.sampling`); so do a renoising round's draw
(`dlrt.kernels.denoiser`) and DiffusionGemma's soft embeddings (`dlrt.kernels.soft_embedding`).
"""

from __future__ import annotations

import torch

from dlrt.decoding.sampling import SamplingMode, SamplingSpec
from dlrt.kernels.activation import silu_mul, silu_mul_fp8
from dlrt.kernels.denoiser import denoiser_draw as _denoiser_draw
from dlrt.kernels.greedy import greedy_candidates
from dlrt.kernels.rms_norm import rms_norm as _rms_norm
from dlrt.kernels.rms_norm import rms_norm_fp8 as _rms_norm_fp8
from dlrt.kernels.rope import qk_norm_rope_write
from dlrt.kernels.sampling import sample_candidates
from dlrt.kernels.soft_embedding import soft_embedding as _soft_embedding
from dlrt.ops import Fp8Activation, Ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel: `residual` is updated in place to x + residual and returned."""
    return _rms_norm(x, weight, eps, residual), residual


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Fp8Activation:
    """One kernel: the norm's output as e4m3 codes and group scales."""
    return Fp8Activation(*_rms_norm_fp8(x, weight, eps), x.dtype)


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[Fp8Activation, torch.Tensor]:
    """One kernel: `residual` updated in place, the norm's output as codes and scales."""
    return Fp8Activation(*_rms_norm_fp8(x, weight, eps, residual), x.dtype), residual


def silu_and_mul_fp8(gate_up: torch.Tensor) -> Fp8Activation:
    """One kernel: silu(gate) * up as e4m3 codes and group scales."""
    return Fp8Activation(*silu_mul_fp8(gate_up), gate_up.dtype)


def candidates(logits: torch.Tensor, sampling: SamplingSpec, mode: SamplingMode, round_idx,
               positions: torch.Tensor, mask_token_id: int = -1
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates [n] int64, confidences [n] fp32) of logits [n, V] without fp32 [n, V]
    probabilities, `mask_token_id` (-1: none) never a candidate; equal to
    `dlrt.decoding.round.reference_candidates`."""
    logits = logits.contiguous()
    if mode.greedy:
        return greedy_candidates(logits, mask_token_id)
    return sample_candidates(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                             sampling.seed, round_idx, positions, mode.top_k, mode.top_p,
                             mask_token_id)


def soft_embedding(logits: torch.Tensor, weight: torch.Tensor, scale=1.0) -> torch.Tensor:
    """One pass over V (two launches): the [n, V] probabilities are never written."""
    return _soft_embedding(logits.contiguous(), weight.contiguous(), scale)


def denoiser_draw(logits: torch.Tensor, temperature, seed, round_idx, positions: torch.Tensor,
                  divided: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over V (two launches), no host sync; the sample can differ from the
    reference's only where two race scores are within a few fp32 ulps."""
    return _denoiser_draw(logits.contiguous(), temperature, seed, round_idx, positions,
                          divided)


OPS = Ops("triton", rms_norm=rms_norm, add_rms_norm=add_rms_norm, silu_and_mul=silu_mul,
          qk_norm_rope_write=qk_norm_rope_write, candidates=candidates,
          rms_norm_fp8=rms_norm_fp8, add_rms_norm_fp8=add_rms_norm_fp8,
          silu_and_mul_fp8=silu_and_mul_fp8, soft_embedding=soft_embedding,
          denoiser_draw=denoiser_draw)
