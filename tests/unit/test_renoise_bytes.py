"""The bytes of a renoising round's vocabulary-sized ops (`dlrt.bench.renoise_bytes`) at
DiffusionGemma-26B-A4B's real geometry (the shipped config)."""

import json

import pytest
import torch

from dlrt.bench.renoise_bytes import renoise_vocab_bytes
from dlrt.models.registry import model_config
from dlrt.resources import data_path


def real_config():
    path = data_path("configs") / "DiffusionGemma-26B-A4B-it" / "config.json"
    return model_config(json.loads(path.read_text()))


def test_real_geometry():
    c = real_config()
    n, v, d = 256, 262144, 2816
    assert (c.canvas_length, c.vocab_size, c.hidden_size) == (n, v, d)
    parts = renoise_vocab_bytes(c)
    # signal [n, V] bf16 + E [V, d] bf16 + out [n, d] bf16
    assert parts["soft_embedding"] == 2 * (n * v + v * d + n * d)
    # logits [n, V] fp32 read, divided [n, V] bf16 written, ids / argmax / entropy [n]
    assert parts["denoiser_draw"] == 4 * n * v + 2 * n * v + 20 * n
    assert parts["total"] == parts["soft_embedding"] + parts["denoiser_draw"]
    assert 2.0e9 < parts["total"] < 2.1e9  # about 0.7 ms at 3 TB/s
    small = renoise_vocab_bytes(c, canvas=32, dtype=torch.float32)
    assert small["soft_embedding"] == 4 * (32 * v + v * d + 32 * d)


def test_needs_a_canvas():
    import dataclasses

    c = dataclasses.replace(real_config(), canvas_length=None)
    with pytest.raises(ValueError, match="has no canvas_length"):
        renoise_vocab_bytes(c)
    assert renoise_vocab_bytes(c, canvas=8)["total"] > 0
