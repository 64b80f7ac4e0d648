"""DiffusionGemma against transformers' own `DiffusionGemmaForBlockDiffusion` (the test extra
pins the version), in fp32 on the CPU.

A tiny reference model with seeded random weights (every norm weight, layer scalar and router
scale off 1; the encoder's layer scalars differ from the decoder's) is written by
`save_pretrained` (vision tower included) and loaded by dlrt's loader; dlrt runs it through
`ModelRunner` with the SDPA backend and a cache of per-layer head shapes. Compared: the K/V the
encoder writes over a prompt (the positions the reference's cache keeps: a sliding layer keeps
the last W - 1), the decoder's logits over a canvas after it (first round without
self-conditioning, then with the previous round's logits), and, once the canvas is committed
(an encoder pass over it), the next canvas's logits. Windows shorter than the canvas and the
prompt, and longer than the whole context; both layer types, full layers with K = V and their
own head size and KV heads; several seeds.

TOL: relative Frobenius-norm error 1e-5 (~100x the fp32 epsilon; measured ~1e-6).
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import SDPABackend
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.loader import load_safetensors, materialize
from dlrt.checkpoint.make import make_checkpoint
from dlrt.models.registry import build_model, model_config
from dlrt.ops import reference
from dlrt.runtime.runner import ModelRunner

pytest.importorskip("transformers.models.diffusion_gemma",
                    reason="this transformers has no diffusion_gemma (the test extra pins it)")
from transformers import (  # noqa: E402
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DynamicCache,
)

TOL = 1e-5
S, F = "sliding_attention", "full_attention"
VOCAB, PROMPT, CANVAS = 128, 11, 8
CPU = torch.device("cpu")
# (seed, sliding window, layer types): the last layer is full whatever it says (both sides
# force it); windows 6 and 3 are shorter than the prompt and the canvas, 40 longer than all
CASES = [(0, 6, [S, F, S, S]), (1, 40, [S, S, F, F]), (2, 3, [F, S, S, F])]
VISION = {"model_type": "gemma4_vision", "hidden_size": 16, "num_hidden_layers": 1,
          "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": 8}


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm()).item()


def _cache_kw() -> str:
    """The cache argument's name (5.25: `cache`; before: `past_key_values`)."""
    params = inspect.signature(DiffusionGemmaForBlockDiffusion.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def reference_model(path: Path, seed: int, window: int, types: list[str]):
    """A tiny reference model with seeded random weights, saved to `path` and read back."""
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, attention_k_eq_v=True, num_experts=4,
                top_k_experts=2, moe_intermediate_size=8, sliding_window=window,
                layer_types=list(types), pad_token_id=0, eos_token_id=[1, 106])
    config = DiffusionGemmaConfig(text_config=text, vision_config=VISION, canvas_length=CANVAS)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(config).float()
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if p.dim() == 1 else 0.15 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + 0.3 * torch.randn_like(b))
    model.save_pretrained(path)
    return DiffusionGemmaForBlockDiffusion.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa").eval()


def our_model(path: Path) -> torch.nn.Module:
    config = model_config(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    materialize(model, torch.float32, CPU)
    load_safetensors(model, CheckpointFolder.open(path))
    return model.eval()


def runner_for(model) -> ModelRunner:
    c = model.config
    cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, 64, torch.float32, CPU,
                         layer_shapes=c.kv_shapes())
    return ModelRunner(model, reference.OPS, SDPABackend(cache, c.num_heads), cache, CPU)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"seed{c[0]}-window{c[1]}")
def pair(request, tmp_path_factory):
    """(reference model, our model, prompt [P], canvases [3, L], signal logits [L, V])."""
    seed, window, types = request.param
    path = tmp_path_factory.mktemp(f"dg-{seed}") / "ckpt"
    ref = reference_model(path, seed, window, types)
    g = torch.Generator().manual_seed(100 + seed)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=g)
    canvases = torch.randint(0, VOCAB, (3, CANVAS), generator=g)
    return ref, our_model(path), prompt, canvases


def _ref_decode(ref, cache, canvas, signal=None) -> torch.Tensor:
    with torch.no_grad():
        out = ref(decoder_input_ids=canvas[None], **{_cache_kw(): cache},
                  self_conditioning_logits=None if signal is None else signal[None])
    return out.logits[0]


def _ref_encode(ref, cache, ids) -> None:
    with torch.no_grad():
        ref.model.encoder(input_ids=ids[None], **{_cache_kw(): cache})


def test_the_encoder_writes_the_reference_cache(pair):
    ref, ours, prompt, _ = pair
    cache = DynamicCache(config=ref.config.text_config)
    _ref_encode(ref, cache, prompt)
    runner = runner_for(ours)
    assert runner.forward(prompt, runner.lens(0, PROMPT), 1) is None  # writes, no logits
    for layer in range(ours.config.num_layers):
        k, v = runner.cache.read(layer, PROMPT)  # [P, Hkv, D]
        ref_k = cache.layers[layer].keys[0].transpose(0, 1)  # the positions it keeps
        ref_v = cache.layers[layer].values[0].transpose(0, 1)
        kept = ref_k.shape[0]
        assert kept == (PROMPT if not ours.config.is_sliding(layer)
                        else min(PROMPT, ours.config.sliding_window - 1))
        assert k.shape[1:] == ref_k.shape[1:]
        assert _rel(k[-kept:], ref_k) < TOL and _rel(v[-kept:], ref_v) < TOL, layer


def test_decoder_logits_with_and_without_self_conditioning(pair):
    """Round 1 (no signal), round 2 (the previous logits), the signal as probabilities, then
    the canvas committed by an encoder pass and the next canvas decoded after it."""
    ref, ours, prompt, canvases = pair
    cache = DynamicCache(config=ref.config.text_config)
    _ref_encode(ref, cache, prompt)
    runner = runner_for(ours)
    runner.forward(prompt, runner.lens(0, PROMPT), 1)
    canvas_lens = runner.lens(PROMPT, PROMPT + CANVAS)
    first = runner.forward(canvas := canvases[0], canvas_lens, None, rows=slice(None))
    ref_first = _ref_decode(ref, cache, canvas)
    assert first.dtype == torch.float32 and first.shape == (CANVAS, VOCAB)
    assert _rel(first, ref_first) < TOL
    assert first.abs().max() < ours.config.final_logit_softcapping
    # NOTE: both sides get the same signal (chained, fp32 rounding differences grow ~10x)
    second = runner.forward(canvas := canvases[1], canvas_lens, None, rows=slice(None),
                            self_conditioning=ref_first)
    ref_second = _ref_decode(ref, cache, canvas, ref_first)
    assert _rel(second, ref_second) < TOL
    assert _rel(second, runner.forward(canvas, canvas_lens, None, rows=slice(None))) > 1e-3
    with torch.no_grad():  # the same signal as probabilities
        h = ours.decode(canvas, canvas_lens[0].long() + torch.arange(CANVAS), _ctx(runner, None),
                        self_conditioning_probs=ref_first.softmax(-1))
    assert _rel(ours.logits(h), ref_second) < TOL
    # commit the canvas: an encoder pass writes its K/V
    _ref_encode(ref, cache, canvas)
    runner.forward(canvas, canvas_lens, 1)
    start = PROMPT + CANVAS
    third = runner.forward(canvases[2], runner.lens(start, start + CANVAS), None,
                           rows=slice(None), self_conditioning=ref_second)
    assert _rel(third, _ref_decode(ref, cache, canvases[2], ref_second)) < TOL


def test_the_decoder_writes_nothing(pair):
    """As the reference's decoder: the whole cache (the canvas positions too) stays as it was."""
    _, ours, prompt, canvases = pair
    runner = runner_for(ours)
    runner.forward(prompt, runner.lens(0, PROMPT), 1)
    before = [t.clone() for t in (*runner.cache.k, *runner.cache.v)]
    runner.forward(canvases[0], runner.lens(PROMPT, PROMPT + CANVAS), None, rows=slice(None))
    after = (*runner.cache.k, *runner.cache.v)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def _ctx(runner: ModelRunner, chunk_block):
    from dlrt.attention.base import ForwardContext, ForwardMeta

    lens = runner.lens(PROMPT, PROMPT + CANVAS)
    meta = ForwardMeta(PROMPT + torch.arange(CANVAS), lens, chunk_block)
    return ForwardContext(runner.backend, meta, runner.cache)


def test_modes_follow_the_chunk_attention(pair):
    _, ours, _, canvases = pair
    runner = runner_for(ours)
    with pytest.raises(ValueError, match="chunk_block 4"):
        ours(canvases[0], torch.arange(CANVAS), _ctx(runner, 4))
    with pytest.raises(ValueError, match="without self-conditioning"):
        ours(canvases[0], torch.arange(CANVAS), _ctx(runner, 1),
             self_conditioning=torch.zeros(CANVAS, VOCAB))
    with pytest.raises(ValueError, match="not both"):
        ours.decode(canvases[0], torch.arange(CANVAS), _ctx(runner, None),
                    torch.zeros(CANVAS, VOCAB), torch.zeros(CANVAS, VOCAB))


def test_vision_tensors_are_skipped_not_unused(tmp_path, caplog):
    path = tmp_path / "ckpt"
    reference_model(path, 0, 6, [S, F, S, F])
    vision = [k for k in CheckpointFolder.open(path).tensor_files if ".vision_tower." in k]
    assert vision
    with caplog.at_level(logging.INFO, logger="dlrt.checkpoint.loader"):
        our_model(path)
    assert "does not use" not in caplog.text
    assert "skipped" in caplog.text and "model.encoder.vision_tower" in caplog.text


def test_a_made_checkpoint_is_the_references(tmp_path):
    """`make-checkpoint tiny-diffusion-gemma` writes what transformers loads (only the vision
    tower missing), and both compute the same logits from it."""
    path = make_checkpoint("tiny-diffusion-gemma", tmp_path / "ckpt", dtype="float32", seed=3)
    ref, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert all(".vision_tower." in k or ".embed_vision." in k for k in info["missing_keys"])
    ours = our_model(path)
    c = ours.config
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, c.vocab_size, (13,), generator=g)
    canvas = torch.randint(0, c.vocab_size, (c.canvas_length,), generator=g)
    cache = DynamicCache(config=ref.config.text_config)
    _ref_encode(ref.eval(), cache, prompt)
    runner = runner_for(ours)
    runner.forward(prompt, runner.lens(0, 13), 1)
    got = runner.forward(canvas, runner.lens(13, 13 + c.canvas_length), None, rows=slice(None))
    assert _rel(got, _ref_decode(ref, cache, canvas)) < TOL
