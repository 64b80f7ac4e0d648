"""The canvas decoder's iteration smoothing equals dInfer's `IterationSmooth`.

The reference below transcribes inclusionAI/dInfer `python/dinfer/decoding/generate_uniform.py`
(`IterSmoothDiffusionLLM.generate` with no KV cache: `BlockRunner.decode` driving
`IterationSmooth.forward`, batch of one) and the `H2Embed` of its model files (temperature 1:
a masked position's input is its embedding plus w * softmax(logits) @ E) as a plain PyTorch
loop over LLaDA written out from the weights of dlrt's model, taking input embeddings. Its
commits are dlrt's rounds (the `threshold`, `credit` and `hierarchical` strategies: dInfer's
decoders that take the per-round bar; temperature 0) at dInfer's bar max(1 - i * decay,
threshold) (`smoothing_reference`). The transcription runs forwards while its block has masks
(dInfer's unrolled forwards past a block's last mask, which advance its round count, are not
run, nor is dlrt's), and does not stop at EOS (the requests set ignore_eos). The cached
canvases are `test_smoothing_cache`'s.

fp32 on the CPU, the LM head sharpened as in `test_canvas_cache`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from smoothing_reference import BlockCommit, Smooth, h2e
from test_canvas_cache import MASK, PROMPT_IDS, SHARPEN, _rms, _rope

from dlrt.errors import OptionError
from dlrt.llm import LLM

DEFAULTS = dict(cont_weight=0.3, cont_weight_init=0.15, cont_weight_growth=0.02,
                threshold_decay=0.02)


@torch.no_grad()
def forward_embeds(llm: LLM, h: torch.Tensor) -> torch.Tensor:
    """LLaDA over input embeddings h [n, H] at positions 0..n-1 -> logits [n, V]."""
    c, t = llm.config, llm.model.model.transformer
    n, d = h.shape[0], c.head_dim
    pos = torch.arange(n)
    for blk in t.blocks:
        a = _rms(h, blk.attn_norm.weight, c.rms_norm_eps)
        q = _rope((a @ blk.qkv.part("q_proj").T).view(n, -1, d), pos, c.rope_theta)
        k = _rope((a @ blk.qkv.part("k_proj").T).view(n, -1, d), pos, c.rope_theta)
        v = (a @ blk.qkv.part("v_proj").T).view(n, -1, d)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d), dim=-1)
        h = h + torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1) @ blk.attn_out.weight.T
        a = _rms(h, blk.ff_norm.weight, c.rms_norm_eps)
        gate = F.silu(a @ blk.ff_gate_up.part("ff_proj").T)
        h = h + (gate * (a @ blk.ff_gate_up.part("up_proj").T)) @ blk.ff_out.weight.T
    return _rms(h, t.ln_f.weight, c.rms_norm_eps) @ t.ff_out.weight.T


def dinfer_smooth(llm: LLM, prompt: list[int], gen_length: int, block_length: int,
                  smooth: Smooth) -> list[int]:
    """`IterSmoothDiffusionLLM.generate` without a cache: the generated ids."""
    embed = llm.model.model.transformer.wte.weight
    x = torch.full((len(prompt) + gen_length,), MASK, dtype=torch.long)
    x[: len(prompt)] = torch.tensor(prompt)
    iter_no = 0
    inputs_embeds = h2e(embed, x)
    for start in range(len(prompt), x.shape[0], block_length):
        end = start + block_length
        commit = BlockCommit(smooth, block_length, embed.shape[0], MASK, block_length)
        while (x[start:end] == MASK).sum() > 0:
            weight, bar = smooth.at(iter_no)
            logits = forward_embeds(llm, inputs_embeds)
            commit(x[start:end], logits[start:end], bar)
            inputs_embeds = h2e(embed, x, x == MASK, logits, weight)
            iter_no += 1
    return x[len(prompt):].tolist()


@pytest.fixture(scope="module")
def llm(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32", device="cpu", decoder="canvas")
    llm.model.model.transformer.ff_out.weight.mul_(SHARPEN)
    return llm


def _generate(llm, prompt, b, gen, threshold, strategy="threshold", **smoothing):
    return llm.generate(prompt, max_new_tokens=gen, block_length=b, denoising_steps=b,
                        remasking_strategy=strategy, threshold=threshold, smoothing=True,
                        ignore_eos=True, **smoothing).token_ids


# (prompt length, block length, generation length, threshold, smoothing values): a padded
# canvas (5 + 24) and a full one (16 + 48), sub-blocks and one block over the generation,
# dInfer's defaults and values whose weight reaches its cap and whose bar reaches the threshold.
CASES = [
    (5, 8, 24, 0.6, {}),
    (16, 16, 48, 0.9, {}),
    (5, 24, 24, 0.7, dict(cont_weight=0.5, cont_weight_init=0.2, cont_weight_growth=0.1,
                          threshold_decay=0.05)),
    (16, 8, 48, 0.5, dict(cont_weight=1.0, cont_weight_init=0.5, cont_weight_growth=0.1,
                          threshold_decay=0.1)),
]


@pytest.mark.parametrize("p,b,gen,threshold,values", CASES)
def test_smoothing_matches_dinfer(llm, p, b, gen, threshold, values):
    prompt = PROMPT_IDS[:p]
    want = dinfer_smooth(llm, prompt, gen, b, Smooth(threshold, **values))
    assert _generate(llm, prompt, b, gen, threshold, **values) == want


@pytest.mark.parametrize("strategy", ["credit", "hierarchical"])
@pytest.mark.parametrize("p,b,gen,threshold,values", CASES[:2])
def test_smoothing_commits_with_dinfer_s_other_decoders(llm, strategy, p, b, gen, threshold,
                                                      values):
    """dInfer's credit and hierarchy decoders take the decaying bar too."""
    prompt = PROMPT_IDS[:p]
    want = dinfer_smooth(llm, prompt, gen, b, Smooth(threshold, strategy, **values))
    assert _generate(llm, prompt, b, gen, threshold, strategy, **values) == want


def test_the_soft_embeddings_are_used(llm):
    """Some request decodes otherwise with the weights at 0 (the bar still decays)."""
    off = dict(cont_weight=0.0, cont_weight_init=0.0)
    assert any(_generate(llm, PROMPT_IDS[:p], b, gen, t, **v)
               != _generate(llm, PROMPT_IDS[:p], b, gen, t, **{**v, **off})
               for p, b, gen, t, v in CASES)


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_bad_smoothing_values_are_named(llm, name):
    with pytest.raises(OptionError, match=rf"^{name}=-1.0 must be a number in \[0, "):
        llm.generate([1, 2], max_new_tokens=4, remasking_strategy="threshold",
                     smoothing=True, **{name: -1.0})
    with pytest.raises(OptionError, match=rf"^{name} must be a number"):
        llm.generate([1, 2], max_new_tokens=4, smoothing=True, **{name: "x"})
    with pytest.raises(OptionError, match=rf"^{name}=0.1 works only with smoothing=True"):
        llm.generate([1, 2], max_new_tokens=4, **{name: 0.1})


def test_refused_combinations_are_named(llm, tiny_llada):
    with pytest.raises(OptionError, match=r"^threshold_decay=2.0 must be a number in \[0, 1\]"):
        llm.generate([1, 2], max_new_tokens=4, remasking_strategy="threshold",
                     smoothing=True, threshold_decay=2.0)
    with pytest.raises(OptionError, match="^smoothing must be true or false"):
        llm.generate([1, 2], max_new_tokens=4, smoothing=1)
    for strategy in ("low_confidence_static", "sequential", "entropy_bounded"):
        with pytest.raises(OptionError, match=r"^smoothing=True works only with "
                                              r"remasking_strategy in \('threshold', "
                                              rf"'credit', 'hierarchical'\), not '{strategy}'"):
            llm.generate([1, 2], max_new_tokens=4, remasking_strategy=strategy, smoothing=True)
    var = LLM(tiny_llada, dtype="float32", device="cpu", decoder="dllm_var")
    with pytest.raises(OptionError, match=r"^smoothing=True works only with the 'canvas' "
                                          r"and 'block' decoders, not 'dllm_var'"):
        var.generate([1, 2], max_new_tokens=4, remasking_strategy="threshold", smoothing=True)


def test_the_front_ends_take_the_options():
    """The command line's flags and the server's request body carry the options."""
    import argparse

    from dlrt.entrypoints.cli import add_decoding_flags, decoding_kwargs
    from dlrt.server.protocol import GenerateRequest

    parser = argparse.ArgumentParser()
    add_decoding_flags(parser)
    args = parser.parse_args(["--smoothing", "--cont-weight", "0.4", "--threshold-decay",
                              "0.1", "--remasking-strategy", "threshold"])
    kw = decoding_kwargs(args)
    assert kw["smoothing"] is True and kw["cont_weight"] == 0.4
    assert kw["threshold_decay"] == 0.1
    with pytest.raises(OptionError, match=r"^--cont-weight-growth: cont_weight_growth=-1.0 "):
        decoding_kwargs(parser.parse_args(["--smoothing", "--cont-weight-growth", "-1"]))
    body = GenerateRequest(prompt="hi", smoothing=True, cont_weight_init=0.2)
    assert body.smoothing is True and body.cont_weight_init == 0.2
