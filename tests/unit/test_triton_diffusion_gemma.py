"""DiffusionGemma's attention on the Triton backend equals the SDPA backend's (CPU: Triton's
interpreter; GPU: the compiled kernel; fp32, relative Frobenius-norm error < 1e-5, measured
up to 5e-7 on the CPU).

Backend level: a cache of per-layer head shapes (a sliding layer of 2 KV heads of 64, window 8;
a full layer of 1 KV head of 128), pages shuffled, cached prefixes shorter than, equal to and
longer than the window; the encoder's causal chunks (K/V written first) and the decoder's
canvas (K/V beside the cache, nothing written). Model level: the tiny preset's encoder and
decoder passes through `ModelRunner` on either backend, the decoder leaving the cache as it was.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from dlrt.attention.base import ForwardContext, ForwardMeta  # noqa: E402
from dlrt.attention.kv_cache import PagedKVCache  # noqa: E402
from dlrt.attention.sdpa import SDPABackend  # noqa: E402
from dlrt.attention.triton import TritonBackend  # noqa: E402
from dlrt.checkpoint.folder import CheckpointFolder  # noqa: E402
from dlrt.checkpoint.loader import load_safetensors, materialize  # noqa: E402
from dlrt.checkpoint.make import make_checkpoint  # noqa: E402
from dlrt.layers.attention import Attention  # noqa: E402
from dlrt.models.registry import build_model, model_config  # noqa: E402
from dlrt.ops import reference  # noqa: E402
from dlrt.runtime.runner import ModelRunner  # noqa: E402

TOL = 1e-5
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
W, HQ = 8, 4
SHAPES = [(2, 64), (1, 128)]  # (Hkv, D): a sliding layer, a full layer
WINDOWS = [W, None]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _cache(shapes, capacity: int, seed: int) -> PagedKVCache:
    """A cache of per-layer shapes, its page table shuffled."""
    cache = PagedKVCache(len(shapes), 0, 0, capacity, torch.float32, DEV, page_size=4,
                         layer_shapes=shapes)
    cache.page_table = torch.randperm(cache.num_pages, generator=torch.Generator()
                                      .manual_seed(seed)).to(DEV, torch.int32)
    return cache


def _snapshot(cache: PagedKVCache) -> list[torch.Tensor]:
    return [t.clone() for t in (*cache.k, *cache.v)]


def _randn(*shape, generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(DEV)


def _unchanged(before: list[torch.Tensor], cache: PagedKVCache) -> bool:
    """Whether the cache holds `before` bit for bit (NaNs included)."""
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(before, (*cache.k, *cache.v), strict=True))


# cached prefixes: shorter than W - 1, W - 1 (what the reference's sliding cache keeps), W,
# W + 1, several windows
STARTS = [3, W - 1, W, W + 1, 30]


@pytest.mark.parametrize("start", STARTS)
def test_the_encoder_chunk_matches_sdpa(start):
    """A causal chunk of 6 at `start` (its K/V written first), each layer with its window."""
    n, g = 6, torch.Generator().manual_seed(start)
    cache = _cache(SHAPES, 48, start)
    sdpa, tri = SDPABackend(cache, HQ), TritonBackend(cache, HQ)
    meta = ForwardMeta(start + torch.arange(n, device=DEV),
                       torch.tensor([start, start + n], dtype=torch.int32, device=DEV), 1)
    for layer, ((h, d), window) in enumerate(zip(SHAPES, WINDOWS, strict=True)):
        cache.write(layer, torch.arange(start + n, device=DEV),
                    _randn(start + n, h, d, generator=g), _randn(start + n, h, d, generator=g))
        q = _randn(n, HQ, d, generator=g)
        want = sdpa.forward(layer, q, 1.0, meta, cache, window)
        assert _rel(tri.forward(layer, q, 1.0, meta, cache, window), want) < TOL


@pytest.mark.parametrize("start", STARTS)
def test_the_decoder_canvas_matches_sdpa_and_writes_nothing(start):
    """A canvas of 12 at `start`, its K/V beside the cache (whose slots there hold NaN): both
    backends agree, equal SDPA with the canvas written, and the cache is left as it was."""
    n, g = 12, torch.Generator().manual_seed(100 + start)
    cache = _cache(SHAPES, 48, start)
    positions = start + torch.arange(n, device=DEV)
    lens = torch.tensor([start, start + n], dtype=torch.int32, device=DEV)
    ctx = {name: ForwardContext(cls(cache, HQ), ForwardMeta(positions, lens, None), cache)
           for name, cls in (("sdpa", SDPABackend), ("triton", TritonBackend))}
    for layer, ((h, d), window) in enumerate(zip(SHAPES, WINDOWS, strict=True)):
        cache.write(layer, torch.arange(start, device=DEV), _randn(start, h, d, generator=g),
                    _randn(start, h, d, generator=g))
        nan = torch.full((n, h, d), float("nan"), device=DEV)
        cache.write(layer, positions, nan, nan)
        attn = Attention(layer, HQ, h, d, reference.OPS, scale=1.0, window=window)
        q, k, v = (_randn(n, heads, d, generator=g) for heads in (HQ, h, h))
        before = _snapshot(cache)
        outs = {name: attn.attend(q, k, v, c, write=False) for name, c in ctx.items()}
        assert _unchanged(before, cache) and not outs["triton"].isnan().any()
        assert _rel(outs["triton"], outs["sdpa"]) < TOL, layer
        written = attn.attend(q, k, v, ctx["sdpa"])  # the canvas written, then read back
        assert _rel(written, outs["sdpa"]) < TOL


def test_sdpa_refuses_chunk_kv_with_another_context():
    cache = _cache(SHAPES, 16, 0)
    meta = ForwardMeta(torch.arange(4, device=DEV),
                       torch.tensor([0, 3], dtype=torch.int32, device=DEV), None)
    kv = (torch.zeros(4, 2, 64, device=DEV), torch.zeros(4, 2, 64, device=DEV))
    with pytest.raises(ValueError, match="kv_len 4\\); got kv_len 3"):
        SDPABackend(cache, HQ).forward(0, torch.zeros(4, HQ, 64, device=DEV), 1.0, meta, cache,
                                       W, kv)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_checkpoint("tiny-diffusion-gemma", tmp_path_factory.mktemp("dg") / "ckpt",
                           dtype="float32", seed=1)
    config = model_config(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    materialize(model, torch.float32, DEV)
    load_safetensors(model, CheckpointFolder.open(path))
    return model.eval()


def _runner(model, backend) -> ModelRunner:
    c = model.config
    cache = _cache(c.kv_shapes(), 64, 7)
    return ModelRunner(model, reference.OPS, backend(cache, c.num_heads), cache, DEV)


def test_the_tiny_model_on_triton_equals_sdpa(tiny):
    """Encode a prompt of 5 (shorter than the window 8), decode a canvas of 16 twice (the
    second with self-conditioning), commit it (an encoder pass: causal over 16, longer than
    the window), decode the next canvas (after 21 keys): the logits of every decoder pass
    agree, and the decoder writes nothing."""
    c, prompt_len = tiny.config, 5
    canvas_len = c.canvas_length
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(0, c.vocab_size - 1, (prompt_len,), generator=g).to(DEV)
    canvases = torch.randint(0, c.vocab_size - 1, (2, canvas_len), generator=g).to(DEV)
    runners = [_runner(tiny, SDPABackend), _runner(tiny, TritonBackend)]
    logits = []
    for run in runners:
        out = []
        run.forward(prompt, run.lens(0, prompt_len), 1)
        start = prompt_len
        lens = run.lens(start, start + canvas_len)
        before = _snapshot(run.cache)
        out.append(run.forward(canvases[0], lens, None, rows=slice(None)))
        out.append(run.forward(canvases[0], lens, None, rows=slice(None),
                               self_conditioning=out[-1]))
        assert _unchanged(before, run.cache)
        run.forward(canvases[0], lens, 1)  # committed: the encoder writes its K/V
        start += canvas_len
        out.append(run.forward(canvases[1], run.lens(start, start + canvas_len), None,
                               rows=slice(None)))
        logits.append(out)
    for want, got in zip(*logits, strict=True):
        assert _rel(got, want) < TOL
    for layer in range(c.num_layers):  # what the encoder wrote
        for a, b in zip(runners[0].cache.read(layer, prompt_len + canvas_len),
                        runners[1].cache.read(layer, prompt_len + canvas_len),
                        strict=True):
            assert _rel(b, a) < TOL
