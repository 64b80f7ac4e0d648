"""dlrt's block decoder equals LLaDA2's `generate()` (`llada2_generate_reference.py`) token for
token, in fp32 on the CPU: threshold decoding (2.0) and joint-threshold editing (2.1).

Two models, their lm_heads sharpened x50 so confidences spread over (0, 1): the thresholds
below make passes commit several masks, and edits happen (the reference counts them and the
tests require some). The tiny SDAR checkpoint, decoded through the block decoder directly (SDAR
does not edit; the loop does not depend on the family), its reference forward written here
from the weights; and the tiny LLaDA2 checkpoint through `LLM.generate` (its family's defaults
and editing), its reference forward `llada2_reference.forward`. Both reference forwards run
the whole sequence with an explicit block-causal mask, independent of dlrt's attention, KV
cache and folded first round.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from llada2_generate_reference import Forward, block_causal_mask, generate
from llada2_reference import forward as llada2_reference_forward
from safetensors.torch import load_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve

MASK = 151669
SHARPEN = 50.0
PROMPT = [9707, 11, 1879, 0, 4021, 315, 279, 1879, 525, 1632, 13, 785, 3974, 13876]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def sdar_forward(llm: LLM, block_length: int) -> Forward:
    """SDAR (Qwen3 layout) from its weights: the whole sequence, block-causal, no cache
    (`embeds` [N, H]: the input embeddings instead of the ids')."""
    c, m = llm.config, llm.model.model

    def forward(ids: torch.Tensor | None, positions: torch.Tensor,
                embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = m.embed_tokens.weight[ids] if embeds is None else embeds
        n, d = x.shape[0], c.head_dim
        allowed = block_causal_mask(positions, block_length)
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            h = _rms(x, layer.input_layernorm.weight, c.rms_norm_eps)
            q, k, v = ((h @ a.qkv_proj.part(name).T).view(n, -1, d)
                       for name in ("q_proj", "k_proj", "v_proj"))
            q = _rope(_rms(q, a.q_norm.weight, c.rms_norm_eps), positions, c.rope_theta)
            k = _rope(_rms(k, a.k_norm.weight, c.rms_norm_eps), positions, c.rope_theta)
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            att = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
            x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1) @ a.o_proj.weight.T
            h = _rms(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
            gate = torch.nn.functional.silu(h @ mlp.gate_up_proj.part("gate_proj").T)
            x = x + (gate * (h @ mlp.gate_up_proj.part("up_proj").T)) @ mlp.down_proj.weight.T
        return _rms(x, m.norm.weight, c.rms_norm_eps) @ llm.model.lm_head.weight.T

    return forward


@pytest.fixture(scope="module")
def llm(tiny_sdar, tmp_path_factory):
    view = Path(tmp_path_factory.mktemp("llada2")) / "ckpt"  # no tokenizer: faster to load
    view.mkdir()
    for name in ("model.safetensors", "generation_config.json", "config.json"):
        os.symlink(Path(tiny_sdar) / name, view / name)
    out = LLM(view, dtype="float32", device="cpu")
    out.model.lm_head.weight.data.mul_(SHARPEN)
    return out


def dlrt_blocks(llm: LLM, prompt: list[int], gen: int, b: int, **options):
    """The block decoder's untrimmed blocks (the family check of `LLM.check` is bypassed:
    SDAR does not edit, the decoding loop is the same)."""
    opts = DecodingOptions.from_kwargs(dict(max_new_tokens=gen, block_length=b, temperature=0.0,
                                            remasking_strategy="threshold", **options))
    params = resolve(opts, llm.decoder_defaults, {}, (), 128, 0)
    with torch.inference_mode():
        return list(llm.decoder.decode(prompt, params))


def check_same(llm: LLM, p: int, b: int, gen: int, threshold: float,
               editing_threshold: float | None = None, max_post_steps: int = 16):
    prompt = PROMPT[:p]
    with torch.inference_mode():
        ref = generate(sdar_forward(llm, b), prompt, gen, b, threshold, MASK,
                       editing_threshold=editing_threshold, max_post_steps=max_post_steps)
    got = dlrt_blocks(llm, prompt, gen, b, threshold=threshold,
                      editing_threshold=editing_threshold, max_post_steps=max_post_steps)
    assert [blk.token_ids for blk in got] == ref.blocks
    assert [blk.rounds for blk in got] == ref.rounds
    assert [blk.commit_rounds for blk in got] == ref.commit_rounds
    if editing_threshold is not None:
        cap = b + max_post_steps + 1
        assert all(r < cap for r in ref.rounds)
    return ref


@pytest.mark.parametrize("p,b,threshold", [(5, 8, 0.3), (8, 8, 0.5), (11, 4, 0.45),
                                           (3, 8, 0.0), (6, 8, 1.0)])
def test_threshold_decoding_matches_llada2_generate(llm, p, b, threshold):
    ref = check_same(llm, p, b, 24, threshold)
    if 0.0 < threshold < 1.0:
        assert ref.multi_commits > 0  # several masks in one pass, and single ones
        assert sum(ref.rounds) > len(ref.rounds)
    if threshold == 0.0:
        assert ref.rounds == [1] * len(ref.rounds)  # the whole block in one pass
    if threshold == 1.0:
        assert sum(ref.rounds) == sum(len(t) for t in ref.blocks)  # one per pass


@pytest.mark.parametrize("editing_threshold", [0.0, 0.5])
@pytest.mark.parametrize("max_post_steps", [0, 2])
@pytest.mark.parametrize("p,b,threshold", [(5, 8, 0.3), (9, 4, 0.6)])
def test_editing_matches_llada2_generate(llm, p, b, threshold, editing_threshold,
                                         max_post_steps):
    ref = check_same(llm, p, b, 24, threshold, editing_threshold, max_post_steps)
    assert ref.edits > 0  # decided tokens were rewritten
    if max_post_steps:
        assert ref.post_passes > 0
    else:
        assert ref.post_passes == 0


def test_editing_off_is_threshold_decoding(llm):
    """editing_threshold None decodes exactly as 2.0 (no extra pass after the last mask)."""
    off = dlrt_blocks(llm, PROMPT[:5], 16, 8, threshold=0.3)
    ref = check_same(llm, 5, 8, 16, 0.3)
    assert [blk.token_ids for blk in off] == ref.blocks and ref.edits == 0


# --- LLaDA2 (the family that edits) through LLM.generate ---------------------------------------

LLADA2_MASK = 156895
LLADA2_PROMPT = [5, 100, 2000, 30000, 156000, 7, 42, 9000, 77]


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    """(LLM, reference forward factory) of the tiny LLaDA2 checkpoint, lm_head sharpened."""
    ckpt = make_checkpoint("tiny-llada2", tmp_path_factory.mktemp("llada2") / "ckpt",
                           dtype="float32")
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * SHARPEN
    hf = json.loads((ckpt / "config.json").read_text())
    llm = LLM(ckpt, dtype="float32", device="cpu")
    llm.model.lm_head.weight.data.mul_(SHARPEN)

    def forward_for(b: int) -> Forward:
        return lambda ids, positions: llada2_reference_forward(
            tensors, hf, ids, block_causal_mask(positions, b))
    return llm, forward_for


@pytest.mark.parametrize("editing_threshold,max_post_steps", [(None, 16), (0.0, 0), (0.0, 2),
                                                              (0.5, 2)])
@pytest.mark.parametrize("p,b", [(6, 8), (9, 4)])
def test_llada2_generate_matches_the_official_loop(llada2, editing_threshold, max_post_steps,
                                                    p, b):
    llm, forward_for = llada2
    prompt, gen, threshold = LLADA2_PROMPT[:p], 20, 0.7
    with torch.inference_mode():
        ref = generate(forward_for(b), prompt, gen, b, threshold, LLADA2_MASK,
                       editing_threshold=editing_threshold, max_post_steps=max_post_steps)
    opts = {} if editing_threshold is None else dict(editing_threshold=editing_threshold)
    got = llm.generate(prompt, gen, block_length=b, threshold=threshold, temperature=0.0,
                       max_post_steps=max_post_steps, ignore_eos=True, **opts)
    assert got.token_ids == [t for blk in ref.blocks for t in blk][:gen]
    assert got.commit_rounds == [r for blk in ref.commit_rounds for r in blk][:gen]
    assert got.denoise_steps == ref.rounds
    if editing_threshold is None:
        assert ref.multi_commits > 0 and ref.edits == 0
    else:
        assert ref.edits > 0


def test_llada2_defaults_are_its_family_s(llada2):
    """Block 32 and `threshold` at 0.95 unless a request says otherwise; no edits by
    default."""
    llm, forward_for = llada2
    assert llm.decoder_defaults == DecoderDefaults(32, "threshold", threshold=0.95)
    prompt = LLADA2_PROMPT[:6]
    with torch.inference_mode():
        ref = generate(forward_for(32), prompt, 40, 32, 0.95, LLADA2_MASK)
    got = llm.generate(prompt, 40, temperature=0.0, ignore_eos=True)
    assert got.token_ids == [t for blk in ref.blocks for t in blk][:40]
    assert got.denoise_steps == ref.rounds
