"""The fused-kernel forward equals the unfused one on whole models.

On the CPU the layers take the PyTorch ops; here they are switched to the Triton kernels (run by
the interpreter) to check the wiring: merged projections, residual plumbing through the fused
RMSNorm, q/k norm + RoPE + cache write, SiLU-and-mul. fp32 weights; logits within 1e-4
relative, and the cache holds the same K/V.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM  # noqa: E402
from dlrt.layers import attention, mlp, norm  # noqa: E402


def forward(llm: LLM, tokens: torch.Tensor, chunk_block: int | None):
    logits = llm.runner.forward_at(tokens, 3, chunk_block)
    cache = llm.runner.cache
    return logits, cache.k.clone(), cache.v.clone()


@pytest.mark.parametrize("ckpt,chunk_block", [("tiny_sdar", 4), ("tiny_sdar_moe", 4),
                                              ("tiny_llada", None)])
def test_fused_forward_matches_unfused(ckpt, chunk_block, request, monkeypatch):
    llm = LLM(request.getfixturevalue(ckpt), max_model_len=64)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, llm.config.vocab_size, (9,), generator=gen)
    ref = forward(llm, tokens, chunk_block)
    llm.runner.cache.k.zero_()
    llm.runner.cache.v.zero_()
    for module in (attention, mlp, norm):
        monkeypatch.setattr(module, "use_kernels", lambda x: True)
    out = forward(llm, tokens, chunk_block)
    for a, b in zip(out, ref):
        err = (a - b).abs().max() / b.abs().max()
        assert err < 1e-4, float(err)
    assert ref[1][:, 0, 3:12].abs().sum() > 0  # the chunk's K/V were written
