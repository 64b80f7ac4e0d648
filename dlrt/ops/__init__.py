"""The ops table: the small ops of a forward and a round, one implementation set chosen at load.

`reference` is plain PyTorch (the CPU path and every kernel's reference); `triton` runs dlrt's
Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1). Layers receive the table when they
are built and never choose for themselves; tests pick a table instead of patching modules.
Projections are not ops: each linear layer holds its own `LinearMethod` (`dlrt.layers.quant`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlrt.errors import OptionError

NAMES = ("reference", "triton")

GROUP = 128  # columns per activation scale of an Fp8Activation
E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def e4m3_scale(amax: torch.Tensor) -> torch.Tensor:
    """The block scale amax / 448 (1 where amax is 0), an IEEE division on every device, as
    the kernels compute it. (Dividing a CUDA tensor by a Python number multiplies by the
    rounded reciprocal instead, which differs in the last bit for some amax.)"""
    return torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))


@dataclass(frozen=True)
class Fp8Activation:
    """An activation handed to an FP8 W8A8 linear layer already quantised, by the op that
    produced it (the `*_fp8` ops below), instead of as a tensor.

    q: float8_e4m3fn [N, K] codes; scale: float32 [N, ceil(K / 128)], one per row (token) and
    128-column group; dtype: the model dtype of the activation they encode. The value is
    q * scale per group, in fp32, cast to dtype. `quantize` makes one from a tensor; the
    Triton ops and `dlrt.kernels.fp8_gemm.quantize_x` write the same codes and scales.
    """

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @classmethod
    def quantize(cls, x: torch.Tensor) -> Fp8Activation:
        """The dynamic FP8 activation quantisation of block-scaled checkpoints (their
        `activation_scheme: "dynamic"`) of x [..., K]: per row (token) and 128-column group
        s = amax(|x|) / 448 (1 for an all-zero group) and codes e4m3(clamp(x / s, -448, 448))
        (round to nearest even, in fp32)."""
        k = x.shape[-1]
        kb = -(-k // GROUP)
        xf = torch.zeros(*x.shape[:-1], kb * GROUP, dtype=torch.float32, device=x.device)
        xf[..., :k] = x.float()
        groups = xf.view(*x.shape[:-1], kb, GROUP)
        amax = groups.abs().amax(dim=-1, keepdim=True)
        scale = e4m3_scale(amax)
        q = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return cls(q.view(*x.shape[:-1], kb * GROUP)[..., :k].contiguous(),
                   scale[..., 0].contiguous(), x.dtype)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        """The encoded value [N, K] in `dtype`."""
        k = self.q.shape[-1]
        scale = self.scale.repeat_interleave(GROUP, dim=-1)[..., :k]
        return (self.q.float() * scale).to(self.dtype)


@dataclass(frozen=True)
class Ops:
    """One implementation of each op; the signatures are those of `dlrt.ops.reference`.

    rms_norm(x [N, H], weight [H], eps) -> y [N, H]
    add_rms_norm(x [N, H], residual [N, H], weight, eps) -> (norm(x + residual), x + residual)
        (the Triton kernel writes the sum into `residual` and returns it)
    silu_and_mul(gate_up [N, 2I]) -> [N, I]
    qk_norm_rope_write(qkv, Hq, Hkv, D, q_weight, k_weight, eps, cos, sin, positions,
        k_cache, v_cache, page_table, full_precision, k_scale=None, v_scale=None)
        -> q [N, Hq, D] (k, v written); cos, sin [N, R/2]: the first R dims of each head are
        rotated (R < D: partial RoPE); a float8_e4m3fn cache stores k / k_scale and
        v / v_scale (fp32 scalar tensors on the device; `reference.quantize_kv`)
    candidates(logits [n, V], sampling, mode, round_idx, positions, mask_token_id=-1)
        -> (ids, confidences); the mask token (a model constant) is never a candidate
    rms_norm_fp8, add_rms_norm_fp8, silu_and_mul_fp8: the same three ops returning their
        output as an `Fp8Activation` (the W8A8 input of an FP8 layer; one kernel with Triton)
    soft_embedding(logits [n, V], weight [V, d], scale) -> [n, d] in weight's dtype:
        (softmax(logits, fp32) @ weight) * scale, DiffusionGemma's self-conditioning input
        (scale: a number or a 0-d CPU tensor; one pass over V with Triton)
    denoiser_draw(logits [n, V], temperature, seed, round_idx, positions [n], divided=None)
        -> (sample [n] int64, argmax [n] int64, entropy [n] fp32) of x = logits / temperature
        (0-d fp32 on the device): the race sample of softmax(x) on the SAMPLE_STREAM noise,
        argmax(x), the entropy of softmax(x) in nats; `divided` [n, V], if given, receives x
        (a renoising round's draw; one pass over V with Triton)
    """

    name: str
    rms_norm: Callable
    add_rms_norm: Callable
    silu_and_mul: Callable
    qk_norm_rope_write: Callable
    candidates: Callable
    rms_norm_fp8: Callable
    add_rms_norm_fp8: Callable
    silu_and_mul_fp8: Callable
    soft_embedding: Callable
    denoiser_draw: Callable


def get_ops(name: str) -> Ops:
    """The ops table `name` ("reference" or "triton"; the Triton one imports the kernels).

    Raises:
        OptionError: unknown name, or Triton is not installed.
    """
    if name not in NAMES:
        raise OptionError(f"unknown kernels {name!r}; one of {NAMES}")
    try:
        module = importlib.import_module(f"dlrt.ops.{name}")
    except ImportError as e:
        raise OptionError(f"kernels {name!r} need {e.name}: pip install {e.name}") from e
    return module.OPS
