"""The L2 prefetch chain (`dlrt.layers.linear.plan`) follows the order a forward runs the
projections in, and `dlrt.kernels.l2_prefetch.prefetch` checks its arguments. The kernel's
instructions are checked in tests/kernels/test_pdl.py, its use on the GPU in
tests/kernels/test_l2_prefetch_gpu.py."""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.kernels import l2_prefetch
from dlrt.layers import linear as linear_mod


def _forward_order(llm, monkeypatch, prompt) -> list[int]:
    """data_ptr of each projection weight in the order `generate` multiplies by them."""
    seen = []
    project = linear_mod._project

    def record(x, weight):
        seen.append(weight.data_ptr())
        return project(x, weight)

    monkeypatch.setattr(linear_mod, "_project", record)
    llm.generate(prompt, max_new_tokens=8, block_length=4, temperature=0, ignore_eos=True)
    monkeypatch.setattr(linear_mod, "_project", project)
    return seen


@pytest.mark.parametrize("ckpt,decoder", [("tiny_sdar", None), ("tiny_sdar_moe", None),
                                          ("tiny_llada", "canvas")])
def test_chain_is_the_forward_order(ckpt, decoder, request, monkeypatch):
    kw = {"decoder": decoder} if decoder else {}
    llm = LLM(request.getfixturevalue(ckpt), device="cpu", **kw)
    assert llm.prefetch_chain == []  # CPU: no prefetch planned
    chain = linear_mod.plan(llm.model, 3 * 2**20)
    nxt = {}
    for mod_name, next_name in chain:
        mod, following = llm.model.get_submodule(mod_name), llm.model.get_submodule(next_name)
        assert mod.prefetch[0] is following.weight and mod.prefetch[1] == 3 * 2**20
        nxt[mod.weight.data_ptr()] = following.weight.data_ptr()
    names = [n for n, _ in chain]
    layers = llm.config.num_layers
    head = llm.model.get_submodule(names[-1]).weight  # the LM head (OLMo: transformer.ff_out)
    assert len(names) == len(set(names))
    assert tuple(head.shape) == (llm.config.vocab_size, llm.config.hidden_size)
    # dense: QKV, o, gate-up, down; MoE: QKV, o, router (the experts are not `Linear`s)
    assert len(names) == layers * (3 if ckpt == "tiny_sdar_moe" else 4) + 1
    order = _forward_order(llm, monkeypatch, [(7 * i + 3) % 500 for i in range(9)])
    head = head.data_ptr()
    first = llm.model.get_submodule(chain[0][0]).weight.data_ptr()
    pairs = list(zip(order, order[1:], strict=False))
    # a forward that needs no logits (a prefill) ends before the LM head: its last projection
    # prefetched the head's first bytes for nothing, and the next forward starts the chain again
    skipped = [(a, b) for a, b in pairs if nxt[a] != b]
    assert all(nxt[a] == head and b == first for a, b in skipped)
    assert len(order) > 2 * len(chain) and len(skipped) < len(pairs) // len(chain)
    assert linear_mod.plan(llm.model, 0) == []
    assert all(m.prefetch is None for m in llm.model.modules() if hasattr(m, "prefetch"))


def test_prefetch_arguments():
    w = torch.zeros(64, 256, dtype=torch.bfloat16)  # 32 KiB
    assert l2_prefetch.lines(w, 2**20) == 256  # capped at the weight's size
    assert l2_prefetch.lines(w, 1000) == 7  # whole lines only
    assert l2_prefetch.lines(w, 100) == 0
    with pytest.raises(ValueError, match="must be contiguous"):
        l2_prefetch.prefetch(w.t(), 4096)
    assert not l2_prefetch.supported(w)
    l2_prefetch.prefetch(w, 4096)  # a CPU tensor: nothing to prefetch into
