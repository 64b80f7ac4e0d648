"""The block-diffusion objective: the training attention mask, the noise and the 1/t loss."""

from __future__ import annotations

import math

import pytest
import torch

from dlrt.train.objective import (
    EPS,
    add_noise,
    block_causal_mask,
    block_diffusion_mask,
    diffusion_inputs,
    diffusion_loss,
    fixed_ratio_noise,
)


@pytest.mark.parametrize("n,b", [(16, 4), (16, 8), (12, 4)])
def test_block_diffusion_mask(n, b):
    """Noisy block i sees noisy block i and clean blocks < i, never clean block i or later
    nor another noisy block; the clean half is block-causal and never sees noisy tokens."""
    allow = block_diffusion_mask(n, b)
    assert allow.shape == (2 * n, 2 * n) and allow.dtype == torch.bool
    for q in range(2 * n):
        q_clean, q_blk = q >= n, (q % n) // b
        for k in range(2 * n):
            k_clean, k_blk = k >= n, (k % n) // b
            if not q_clean and not k_clean:
                want = k_blk == q_blk
            elif not q_clean:
                want = k_blk < q_blk
            elif k_clean:
                want = k_blk <= q_blk
            else:
                want = False
            assert bool(allow[q, k]) == want, (q, k)
    assert torch.equal(allow[n:, n:], block_causal_mask(n, b))


def test_mask_examples():
    """Blocks of 4 over 8 tokens: the second noisy block (rows 4..7) sees noisy 4..7 and
    clean 8..11 (clean block 0), not clean 12..15 (its own clean block)."""
    allow = block_diffusion_mask(8, 4)
    row = allow[5].nonzero().flatten().tolist()
    assert row == [4, 5, 6, 7, 8, 9, 10, 11]
    assert allow[0].nonzero().flatten().tolist() == [0, 1, 2, 3]  # first noisy block: itself
    assert allow[13].nonzero().flatten().tolist() == list(range(8, 16))


def test_diffusion_inputs():
    x_t, x0 = torch.tensor([[9, 2, 9, 4]]), torch.tensor([[1, 2, 3, 4]])
    ids, pos = diffusion_inputs(x_t, x0)
    assert ids.tolist() == [[9, 2, 9, 4, 1, 2, 3, 4]]
    assert pos.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


def test_add_noise_one_ratio_per_block():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(3, 100, (64, 32), generator=g)
    x_t, masked, t = add_noise(x0, 4, mask_id=1, generator=g)
    blocks = t.view(64, 8, 4)
    assert torch.equal(blocks, blocks[..., :1].expand_as(blocks))  # constant in a block
    assert float(t.min()) >= EPS and float(t.max()) <= 1
    assert torch.equal(x_t[masked], torch.ones_like(x_t[masked]))
    assert torch.equal(x_t[~masked], x0[~masked])
    # the share masked follows t: about E[t] = 1/2 overall, more where t is high
    assert 0.4 < masked.float().mean() < 0.6
    assert masked[t > 0.8].float().mean() > 0.75 and masked[t < 0.2].float().mean() < 0.25
    with pytest.raises(ValueError, match="multiple"):
        add_noise(x0[:, :30], 4, 1)


def test_fixed_ratio_noise_masks_half_of_each_block():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(3, 100, (8, 24), generator=g)
    for b in (4, 8):
        x_t, masked = fixed_ratio_noise(x0, b, 1, 0.5, g)
        assert (masked.view(8, -1, b).sum(-1) == b // 2).all()
        assert torch.equal(x_t[~masked], x0[~masked]) and (x_t[masked] == 1).all()


def test_loss_weighting_by_hand():
    """Two windows of 4 tokens; three masked positions with ratios 0.5, 0.25 and 1:
    CE = ln 3 (uniform), ln 2 (p = 2/4), ln 8 (p = 1/8); unmasked positions weigh nothing;
    loss = (ln 3 / 0.5 + ln 2 / 0.25 + ln 8 / 1) / 8 = (2 ln 3 + 7 ln 2) / 8."""
    logits = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)) * 5
    logits[0, 0] = torch.tensor([0.0, 0.0, 0.0])
    logits[0, 2] = torch.tensor([math.log(2), 0.0, 0.0])
    logits[1, 1] = torch.tensor([0.0, 0.0, math.log(6)])
    x0 = torch.tensor([[0, 2, 0, 1], [2, 1, 0, 0]])
    masked = torch.zeros(2, 4, dtype=torch.bool)
    masked[0, 0] = masked[0, 2] = masked[1, 1] = True
    t = torch.tensor([[0.5, 0.5, 0.25, 0.25], [1.0, 1.0, 0.3, 0.3]])
    loss = diffusion_loss(logits, x0, masked, t)
    assert loss.item() == pytest.approx((2 * math.log(3) + 7 * math.log(2)) / 8, rel=1e-6)
    assert diffusion_loss(logits.bfloat16(), x0, masked, t).dtype == torch.float32
    assert diffusion_loss(logits, x0, torch.zeros_like(masked), t).item() == 0
