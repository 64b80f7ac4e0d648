"""SDAR's block-diffusion objective (JetAstra/SDAR `training/`, the SDAR and BD3-LM papers).

A clean window x0 of N tokens is cut into blocks of B. Each block draws a mask ratio
t ~ U(0, 1], clamped to [eps, 1] as t = eps + (1 - eps) u; each of its positions is replaced
by the mask token with probability t. The model reads [noisy x_t ; clean x0] (2N tokens,
positions 0..N-1 twice) under `block_diffusion_mask`: a noisy block sees itself in both
directions and the clean blocks before it, the clean half is block-causal, so one forward
trains every block against a clean prefix, as the block decoder runs it (a block denoised
against the cached earlier blocks). The loss is the masked-diffusion bound:

    loss = sum over masked positions i of CE(logits_i, x0_i) / t_i,  divided by B_rows * N

(each position weighted 1/t of its block; normalised by all tokens, masked or not, as SDAR's
`loss / answer_len` with no prompt). NOTE: SDAR's code draws one t per sequence; per block, as
here, gives each block its own noise level within one window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-3


def block_diffusion_mask(n: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[2n, 2n] bool (True = query row may attend key column) over [noisy; clean].

    noisy block i sees noisy block i and clean blocks < i; clean block i sees clean blocks
    <= i; clean positions never see noisy ones.
    """
    idx = torch.arange(2 * n, device=device)
    clean = idx >= n
    blk = (idx % n) // block
    q_clean, k_clean = clean[:, None], clean[None, :]
    q_blk, k_blk = blk[:, None], blk[None, :]
    same_noisy = ~q_clean & ~k_clean & (q_blk == k_blk)
    noisy_sees_prefix = ~q_clean & k_clean & (k_blk < q_blk)
    clean_causal = q_clean & k_clean & (k_blk <= q_blk)
    return same_noisy | noisy_sees_prefix | clean_causal


def block_causal_mask(n: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[n, n] bool: position i sees j iff j // block <= i // block (dlrt's prefill)."""
    blk = torch.arange(n, device=device) // block
    return blk[None, :] <= blk[:, None]


def add_noise(x0: torch.Tensor, block: int, mask_id: int, generator: torch.Generator | None = None,
              eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_t [R, N], masked [R, N] bool, t [R, N] fp32: the ratio of each position's block).

    x0: [R, N] int64 with N a multiple of `block`.
    """
    rows, n = x0.shape
    if n % block:
        raise ValueError(f"window length {n} is not a multiple of the block length {block}")
    u = torch.rand(rows, n // block, device=x0.device, generator=generator)
    t = (eps + (1 - eps) * u).repeat_interleave(block, dim=1)  # [R, N]
    masked = torch.rand(rows, n, device=x0.device, generator=generator) < t
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked, t


def fixed_ratio_noise(x0: torch.Tensor, block: int, mask_id: int, ratio: float,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, masked) with exactly round(ratio * block) random positions masked per block:
    the evaluation's noise (held-out accuracy at mask ratio 0.5)."""
    rows, n = x0.shape
    k = max(1, round(ratio * block))
    scores = torch.rand(rows, n // block, block, device=x0.device, generator=generator)
    ranks = scores.argsort(dim=-1).argsort(dim=-1)
    masked = (ranks < k).reshape(rows, n)
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked


def diffusion_inputs(x_t: torch.Tensor, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [R, 2N] = [x_t ; x0], positions [2N] = 0..N-1 twice)."""
    n = x0.shape[1]
    pos = torch.arange(n, device=x0.device)
    return torch.cat((x_t, x0), dim=1), torch.cat((pos, pos))


def diffusion_loss(logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor,
                   t: torch.Tensor) -> torch.Tensor:
    """sum over masked positions of CE(logits, x0) / t, divided by the number of positions.

    logits: [R, N, V] of the noisy half (any float dtype; the loss is fp32); x0: [R, N] int64;
    masked: [R, N] bool; t: [R, N] fp32. Every position is computed and the unmasked ones
    weigh 0, so the shapes never depend on the draw (no host sync, one compiled graph).
    """
    ce = F.cross_entropy(logits.float().flatten(0, 1), x0.flatten(), reduction="none")
    weight = masked.flatten().float() / t.flatten()
    return (ce * weight).sum() / x0.numel()


def noisy_logits(model, x_t: torch.Tensor, x0: torch.Tensor, allow: torch.Tensor
                 ) -> torch.Tensor:
    """Logits [R, N, V] of the noisy half, read in the block-diffusion layout."""
    ids, positions = diffusion_inputs(x_t, x0)
    return model.logits(model(ids, positions, allow)[:, : x0.shape[1]])


def masked_logits(model, x_t: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor,
                  allow: torch.Tensor) -> torch.Tensor:
    """Logits [M, V] of the masked positions of x_t, read in the block-diffusion layout."""
    ids, positions = diffusion_inputs(x_t, x0)
    hidden = model(ids, positions, allow)[:, : x0.shape[1]]  # noisy half: [R, N, H]
    return model.logits(hidden[masked])
