"""The runner's dispatch to the persistent round (`ModelRunner.persistent`, given at
construction): the forwards it serves take its logits (the rows asked for, as a slice or an
index tensor) and skip the layers; every other forward (prefill, no LM head rows, a length or
chunk block it was not built for) runs the layers. A runner gets every part at construction:
none can be set afterwards."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import SDPABackend
from dlrt.checkpoint.presets import preset
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM
from dlrt.ops import get_ops
from dlrt.runtime.runner import ModelRunner


class _Rounds:
    """Serves 4-token forwards at chunk block 4 with recognisable logits."""

    def __init__(self, vocab):
        self.calls, self.vocab = [], vocab

    def forward(self, tokens, lens, chunk_block):
        if tokens.shape[0] != 4 or chunk_block != 4:
            return None
        self.calls.append(lens.tolist())
        return torch.arange(4 * self.vocab, dtype=torch.float32).view(4, self.vocab)


def test_dispatch():
    config = sdar_config(preset("tiny-sdar")[0], "sdar")
    model = SDARForCausalLM(config, get_ops("reference")).eval()
    cache = PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 64,
                         torch.float32, "cpu")
    fake = _Rounds(config.vocab_size)
    backend = SDPABackend(cache, config.num_heads)
    runner = ModelRunner(model, get_ops("reference"), backend, cache, torch.device("cpu"),
                         persistent=fake)
    tokens, lens = torch.arange(4), torch.tensor([0, 4], dtype=torch.int32)
    got = runner.forward(tokens, lens, 4, rows=slice(1, 3))
    assert torch.equal(got, fake.forward(tokens, lens, 4)[1:3]) and len(fake.calls) == 2
    got = runner.forward(tokens, lens, 4, rows=torch.tensor([3, 0]))
    assert torch.equal(got[:, 0], torch.tensor([3.0, 0.0]) * config.vocab_size)
    fake.calls.clear()
    assert runner.forward(tokens, lens, 4, rows=None) is None  # no LM head: the layers
    layers = runner.forward(torch.arange(8), torch.tensor([0, 8], dtype=torch.int32), 4,
                            rows=slice(None))  # a length it was not built for
    assert layers.shape == (8, config.vocab_size) and not fake.calls
    plain = ModelRunner(model, get_ops("reference"), backend, cache, torch.device("cpu"))
    out = plain.forward(tokens, lens, 4, rows=slice(None))  # none: the layers
    assert out.shape == (4, config.vocab_size) and not fake.calls
    assert plain.persistent is None and plain.vocab is None


def test_a_runner_cannot_be_completed_afterwards():
    config = sdar_config(preset("tiny-sdar")[0], "sdar")
    cache = PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 64,
                         torch.float32, "cpu")
    runner = ModelRunner(SDARForCausalLM(config, get_ops("reference")), get_ops("reference"),
                         SDPABackend(cache, config.num_heads), cache, torch.device("cpu"))
    for part in ("persistent", "vocab", "backend", "cache", "model"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(runner, part, None)
    with pytest.raises(TypeError):
        ModelRunner(runner.model, runner.ops, runner.backend)  # no cache, no device
