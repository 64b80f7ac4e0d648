"""Attention with sliding windows and layers of different head shapes (DiffusionGemma): the SDPA
backend's masks against their definition (`dlrt.attention.base`), its output against attention
computed here from the cache, and the paged cache with one head shape per layer."""

from __future__ import annotations

import itertools

import pytest
import torch

from dlrt.attention.base import ForwardContext, ForwardMeta
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import SDPABackend, chunk_mask
from dlrt.layers.attention import Attention
from dlrt.ops import reference
from dlrt.ops.reference import KV_FP8


def visible(i: int, j: int, start: int, chunk_block: int | None, window: int | None) -> bool:
    """Whether query i of a chunk at `start` sees key j: the definition, one pair at a time."""
    p = start + i
    if chunk_block is not None and j >= start and (j - start) // chunk_block > i // chunk_block:
        return False
    anchor = p if chunk_block is not None else start
    return window is None or j > anchor - window


@pytest.mark.parametrize("chunk_block,window",
                         list(itertools.product([None, 1, 3], [None, 1, 4, 9])))
def test_masks_follow_the_definition(chunk_block, window):
    n, start = 7, 10
    kv_len = start + n
    mask = chunk_mask(n, start, kv_len, chunk_block, "cpu", window)
    if chunk_block is None and window is None:
        assert mask is None
        return
    want = torch.tensor([[visible(i, j, start, chunk_block, window) for j in range(kv_len)]
                         for i in range(n)])
    assert torch.equal(mask, want)


def test_the_two_windowed_masks():
    """Causal with window 3: the 3 keys up to each query; a full canvas with window 3: the 2
    keys before it and all of itself."""
    causal = chunk_mask(3, 5, 8, 1, "cpu", 3)
    assert causal[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert causal[2].nonzero().flatten().tolist() == [5, 6, 7]
    canvas = chunk_mask(3, 5, 8, None, "cpu", 3)
    assert all(row.nonzero().flatten().tolist() == [3, 4, 5, 6, 7] for row in canvas)


def _cache(shapes, dtype=torch.float32, max_tokens=40):
    return PagedKVCache(len(shapes), 0, 0, max_tokens, dtype, "cpu", page_size=4,
                        layer_shapes=shapes)


def test_a_cache_of_per_layer_shapes():
    shapes = [(2, 8), (1, 16), (2, 8)]
    cache = _cache(shapes)
    assert not cache.uniform and [tuple(k.shape[-2:]) for k in cache.k] == shapes
    assert cache.nbytes == 2 * 40 * 4 * sum(h * d for h, d in shapes)
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([3, 0, 9, 17])
    for layer, (h, d) in enumerate(shapes):
        k, v = torch.randn(4, h, d, generator=g), torch.randn(4, h, d, generator=g)
        cache.write(layer, pos, k, v)
        got_k, got_v = cache.read(layer, 18)
        assert torch.equal(got_k[pos], k) and torch.equal(got_v[pos], v)
    same = PagedKVCache(3, 2, 8, 40, torch.float32, "cpu", layer_shapes=[(2, 8)] * 3)
    assert same.uniform and same.k.shape == (3, 3, 16, 2, 8)
    with pytest.raises(ValueError, match="one \\(Hkv, D\\) per layer \\(3\\)"):
        PagedKVCache(3, 2, 8, 40, torch.float32, "cpu", layer_shapes=[(2, 8)] * 2)


def test_an_fp8_cache_of_per_layer_shapes():
    cache = PagedKVCache(2, 0, 0, 16, KV_FP8, "cpu", layer_shapes=[(2, 8), (1, 16)],
                         k_scale=torch.tensor([0.5, 2.0]), v_scale=torch.tensor([1.0, 0.25]))
    k, v = torch.randn(3, 1, 16), torch.randn(3, 1, 16)
    cache.write(1, torch.arange(3), k, v)
    got_k, got_v = cache.read(1, 3)
    assert torch.allclose(got_k, k, rtol=0.07, atol=0.02)
    assert torch.allclose(got_v, v, rtol=0.07, atol=0.01)


@pytest.mark.parametrize("chunk_block,window", [(1, 3), (None, 3), (1, None), (None, None)])
def test_sdpa_attends_the_visible_keys(chunk_block, window):
    """Each layer (its own head shape) against softmax(scale q.k) over the visible keys."""
    shapes, hq, n, start = [(2, 8), (1, 16)], 4, 5, 6
    cache = _cache(shapes)
    backend = SDPABackend(cache, hq)
    g = torch.Generator().manual_seed(1)
    positions = torch.arange(start + n)
    lens = torch.tensor([start, start + n], dtype=torch.int32)
    meta = ForwardMeta(positions[start:], lens, chunk_block)
    for layer, (h, d) in enumerate(shapes):
        k, v = torch.randn(start + n, h, d, generator=g), torch.randn(start + n, h, d, generator=g)
        cache.write(layer, positions, k, v)
        q = torch.randn(n, hq, d, generator=g)
        out = backend.forward(layer, q, 0.7, meta, cache, window)
        for i, head in itertools.product(range(n), range(hq)):
            seen = [j for j in range(start + n) if visible(i, j, start, chunk_block, window)]
            kv = head // (hq // h)
            w = torch.softmax(0.7 * k[seen, kv] @ q[i, head], dim=0)
            assert torch.allclose(out[i, head], w @ v[seen, kv], atol=1e-5)


def test_attention_layer_scale_window_and_attend():
    """`Attention.attend` writes k and v at the chunk's positions and attends with the layer's
    scale and window; without them the scale stays D ** -0.5 and no window applies."""
    assert Attention(0, 4, 2, 16, reference.OPS).scale == 0.25
    assert Attention(0, 4, 2, 16, reference.OPS).window is None
    layer = Attention(1, 4, 1, 16, reference.OPS, scale=1.0, window=2)
    cache = _cache([(2, 8), (1, 16)])
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, h, 16, generator=g) for h in (4, 1, 1))
    lens = torch.tensor([0, 3], dtype=torch.int32)
    ctx = ForwardContext(SDPABackend(cache, 4), ForwardMeta(torch.arange(3), lens, 1), cache)
    out = layer.attend(q, k, v, ctx)  # [3, 4 * 16]
    assert torch.equal(cache.read(1, 3)[0], k) and torch.equal(cache.read(1, 3)[1], v)
    last = torch.softmax(k[1:, 0] @ q[2, 0], dim=0) @ v[1:, 0]  # window 2: keys 1, 2
    assert torch.allclose(out[2, :16], last, atol=1e-6)
    assert torch.allclose(out[0, :16], v[0, 0], atol=1e-6)  # sees itself only
