"""The canvas decoder's approximate KV caches equal Fast-dLLM's decoding loops.

The reference below transcribes NVlabs/Fast-dLLM `llada/generate.py` (`get_num_transfer_tokens`,
`get_transfer_index` with `low_confidence` remasking, with quotas or with `threshold`,
`generate_with_prefix_cache`, `generate_with_dual_cache`; temperature 0, batch of one) as plain
PyTorch loops over a model with Fast-dLLM's interface: `model(x, past_key_values,
replace_position)` -> (logits, per-layer K/V). That model (`FastForward`) is LLaDA written out
from the weights of dlrt's model: without past K/V the tokens sit at positions 0..; with past
K/V and no `replace_position` they follow the past and see it; with `replace_position` they sit
at its positions, their K/V replace the past's there, and they see the whole replaced K/V.

fp32 on the CPU; the LM head is scaled by SHARPEN so the confidences are spread (the threshold
then commits varying counts per round) and far apart compared with fp32 noise.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dlrt.errors import OptionError
from dlrt.llm import LLM

SHARPEN = 50.0
MASK = 126336


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)[:, None, :]
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * ang.cos() + rot * ang.sin()


class FastForward:
    """LLaDA from dlrt's weights with Fast-dLLM's past-K/V and `replace_position` interface
    (batch of one: x [1, n] -> logits [1, n, V]; or `inputs_embeds` [1, n, H] instead of x,
    as dInfer's models take)."""

    def __init__(self, llm: LLM):
        self.c, self.t = llm.config, llm.model.model.transformer

    @torch.no_grad()
    def __call__(self, x: torch.Tensor | None, past_key_values: list | None = None,
                 replace_position: torch.Tensor | None = None,
                 inputs_embeds: torch.Tensor | None = None):
        c, t = self.c, self.t
        h = t.wte.weight[x[0]] if inputs_embeds is None else inputs_embeds[0]
        n, d = h.shape[0], c.head_dim
        if replace_position is not None:
            pos = replace_position[0].nonzero()[:, 0]
        else:
            start = 0 if past_key_values is None else past_key_values[0][0].shape[0]
            pos = torch.arange(start, start + n)
        kv = []
        for i, blk in enumerate(t.blocks):
            a = _rms(h, blk.attn_norm.weight, c.rms_norm_eps)
            q = _rope((a @ blk.qkv.part("q_proj").T).view(n, -1, d), pos, c.rope_theta)
            k = _rope((a @ blk.qkv.part("k_proj").T).view(n, -1, d), pos, c.rope_theta)
            v = (a @ blk.qkv.part("v_proj").T).view(n, -1, d)
            if past_key_values is not None:
                pk, pv = past_key_values[i]
                if replace_position is not None:
                    k_all, v_all = pk.clone(), pv.clone()
                    k_all[pos], v_all[pos] = k, v
                    k, v = k_all, v_all
                else:
                    k, v = torch.cat([pk, k]), torch.cat([pv, v])
            kv.append((k, v))
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d), dim=-1)
            h = h + torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1) @ blk.attn_out.weight.T
            a = _rms(h, blk.ff_norm.weight, c.rms_norm_eps)
            gate = F.silu(a @ blk.ff_gate_up.part("ff_proj").T)
            h = h + (gate * (a @ blk.ff_gate_up.part("up_proj").T)) @ blk.ff_out.weight.T
        h = _rms(h, t.ln_f.weight, c.rms_norm_eps)
        return (h @ t.ff_out.weight.T)[None], kv


# ------------------------------------------------------------ Fast-dLLM `generate.py`, transcribed


def get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    out = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        out[i, : remainder[i]] += 1
    return out


def get_transfer_index(logits, mask_index, x, num_transfer_tokens, threshold=None):
    x0 = torch.argmax(logits, dim=-1)  # temperature 0: no Gumbel noise
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.gather(p, -1, x0[..., None])[..., 0]  # low_confidence
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -math.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer_index[j, select_index] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select_index[k]] < threshold:
                    transfer_index[j, select_index[k]] = False
    return x0, transfer_index


def fast_dllm(model, prompt: list[int], steps: int, gen_length: int, block_length: int,
              threshold: float | None, cache: str) -> tuple[list[int], list[int]]:
    """`generate_with_prefix_cache` / `generate_with_dual_cache`: (generated ids, forwards
    per block)."""
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[:, : len(prompt)] = torch.tensor(prompt)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps_per_block = steps // num_blocks
    forwards = []
    for num_block in range(num_blocks):
        start = len(prompt) + num_block * block_length
        end = start + block_length
        num_transfer = get_num_transfer_tokens(x[:, start:end] == MASK, steps_per_block)
        logits, past = model(x)
        mask_index = x == MASK
        mask_index[:, end:] = 0
        x0, transfer = get_transfer_index(logits, mask_index, x,
                                          num_transfer[:, 0] if threshold is None else None,
                                          threshold)
        x[transfer] = x0[transfer]
        if cache == "prefix":
            past = [(k[:start], v[:start]) for k, v in past]
        replace = torch.zeros_like(x, dtype=torch.bool)
        replace[:, start:end] = 1
        i = 1
        while (x[:, start:end] == MASK).sum() > 0:
            if cache == "prefix":
                mask_index = x[:, start:] == MASK
                mask_index[:, block_length:] = 0
                logits, _ = model(x[:, start:], past_key_values=past)
                x0, transfer = get_transfer_index(
                    logits, mask_index, x[:, start:],
                    num_transfer[:, i] if threshold is None else None, threshold)
                x[:, start:][transfer] = x0[transfer]
            else:
                mask_index = x[:, start:end] == MASK
                logits, _ = model(x[:, start:end], past_key_values=past,
                                  replace_position=replace)
                x0, transfer = get_transfer_index(
                    logits, mask_index, x[:, start:end],
                    num_transfer[:, i] if threshold is None else None, threshold)
                x[:, start:end][transfer] = x0[transfer]
            i += 1
        forwards.append(i)
    return x[0, len(prompt):].tolist(), forwards


# ------------------------------------------------------------------------------------ tests

PROMPT_IDS = [9707, 11, 1879, 0, 4021, 315, 279, 1879, 525, 1632, 13, 77, 4242, 88, 1001, 5]


@pytest.fixture(scope="module")
def llm(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32", device="cpu", decoder="canvas")
    llm.model.model.transformer.ff_out.weight.mul_(SHARPEN)
    return llm


# (cache, prompt length, block length, steps per block, generation length, threshold):
# prompts that leave the 64-slot canvas padded (5, 7, 3) and that fill it exactly (16 + 48),
# prompt lengths that are and are not multiples of the block length; thresholds at which
# sub-blocks take from one round to all of theirs.
CASES = [
    ("prefix", 5, 4, 4, 12, None), ("prefix", 16, 8, 4, 48, None),
    ("prefix", 8, 4, 2, 16, None), ("prefix", 7, 8, 8, 24, 0.6),
    ("prefix", 16, 16, 16, 48, 0.8),
    ("dual", 5, 4, 4, 12, None), ("dual", 16, 8, 4, 48, None),
    ("dual", 8, 4, 2, 16, None), ("dual", 7, 8, 8, 24, 0.6),
    ("dual", 16, 16, 16, 48, 0.6), ("dual", 3, 12, 6, 12, None),
]


@pytest.mark.parametrize("cache,p,b,steps,gen,threshold", CASES)
def test_canvas_cache_matches_fast_dllm(llm, cache, p, b, steps, gen, threshold):
    prompt = PROMPT_IDS[:p]
    want, forwards = fast_dllm(FastForward(llm), prompt, steps * (gen // b), gen, b,
                               threshold, cache)
    strategy = dict(remasking_strategy="low_confidence_static") if threshold is None else \
        dict(remasking_strategy="threshold", threshold=threshold)
    got = llm.generate(prompt, max_new_tokens=gen, block_length=b, denoising_steps=steps,
                       canvas_cache=cache, ignore_eos=True, **strategy)
    assert got.token_ids == want
    assert got.denoise_steps == forwards


def test_cache_is_approximate(llm):
    """The cached K/V are stale by design: some request decodes otherwise than exactly."""
    opts = dict(max_new_tokens=24, block_length=4, denoising_steps=4, ignore_eos=True,
                remasking_strategy="low_confidence_static")
    exact = llm.generate(PROMPT_IDS[:5], **opts).token_ids
    for cache in ("prefix", "dual"):
        assert llm.generate(PROMPT_IDS[:5], canvas_cache=cache, **opts).token_ids != exact


def test_bad_canvas_cache_is_named(llm):
    with pytest.raises(OptionError, match=r"^canvas_cache='ring' must be one of"):
        llm.generate([1, 2], max_new_tokens=4, canvas_cache="ring")
    with pytest.raises(OptionError, match="canvas_cache must be a string"):
        llm.generate([1, 2], max_new_tokens=4, canvas_cache=1)


def test_canvas_cache_needs_the_canvas_decoder(tiny_llada):
    var = LLM(tiny_llada, dtype="float32", device="cpu", decoder="dllm_var")
    with pytest.raises(OptionError, match=r"^canvas_cache='prefix' works only with the "
                                          r"'canvas' decoder"):
        var.generate([1, 2], max_new_tokens=4, canvas_cache="prefix")
    assert var.generate([1, 2], max_new_tokens=4, canvas_cache="none").token_ids
