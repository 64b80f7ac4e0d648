"""Held-out masked-token accuracy at mask ratio 0.5, beside the unigram baseline.

Each held-out window is cut into blocks; exactly half of each block's positions are masked
(fixed seed: every evaluation masks the same positions) and the model reads the noisy window
in the block-diffusion layout (each noisy block against the clean blocks before it, as the
block decoder runs). Accuracy is the share of masked positions whose argmax is the true
token; the unigram baseline always guesses the most frequent training token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from dlrt.train.objective import block_diffusion_mask, fixed_ratio_noise, masked_logits

MASK_RATIO = 0.5
EVAL_SEED = 1234


@torch.no_grad()
def masked_accuracy(model, windows: torch.Tensor, block: int, mask_id: int, top_token: int,
                    autocast, batch: int) -> dict[str, float]:
    """{"accuracy", "loss" (mean CE of the masked positions), "unigram_accuracy"}."""
    device = windows.device
    gen = torch.Generator(device).manual_seed(EVAL_SEED)
    allow = block_diffusion_mask(windows.shape[1], block, device)
    correct = unigram = total = 0
    ce = torch.zeros((), device=device, dtype=torch.float64)
    for x0 in windows.split(batch):
        x_t, masked = fixed_ratio_noise(x0, block, mask_id, MASK_RATIO, gen)
        with autocast():
            logits = masked_logits(model, x_t, x0, masked, allow).float()
        target = x0[masked]
        correct += int((logits.argmax(-1) == target).sum())
        unigram += int((target == top_token).sum())
        ce += F.cross_entropy(logits, target, reduction="sum").double()
        total += target.numel()
    return {"accuracy": correct / total, "loss": ce.item() / total,
            "unigram_accuracy": unigram / total}


def evaluate(model, windows: torch.Tensor, block: int, mask_id: int, top_token: int,
             autocast, step: int, long_block: int | None = None) -> dict[str, Any]:
    """The evaluation record at `step` (block `block`; also `long_block` when given)."""
    was_training = model.training
    model.eval()
    batch = min(64, windows.shape[0])
    out: dict[str, Any] = {"step": step, "block_length": block,
                           **masked_accuracy(model, windows, block, mask_id, top_token,
                                             autocast, batch)}
    if long_block:
        out["long_block"] = {"block_length": long_block,
                             **masked_accuracy(model, windows, long_block, mask_id, top_token,
                                               autocast, batch)}
    model.train(was_training)
    return out
