"""The block decoder's iteration smoothing equals dInfer's `IterationSmooth` loop applied to
block decoding (`smoothing_reference.smooth_blocks`), token for token in fp32 on the CPU.

Two models, their LM heads sharpened x50 (confidences spread over (0, 1)): the tiny SDAR
checkpoint and the tiny LLaDA2 one (its family's defaults: block 32, `threshold` at 0.95).
Their reference forwards (`test_llada2_parity.sdar_forward`, `llada2_reference.forward`) run
the whole sequence from input embeddings with an explicit block-causal mask, independent of
dlrt's KV cache, folded first round and `embeds_add`. Eager mode and the host_loop mode run on
the CPU (`cpu_graph_modes.simulate`). The models' `embeds_add` is checked on its own:
zeros change nothing, other values equal the reference forward of the summed embeddings.
"""

from __future__ import annotations

import json

import pytest
import torch
from cpu_graph_modes import simulate
from llada2_generate_reference import block_causal_mask
from llada2_reference import forward as llada2_reference_forward
from safetensors.torch import load_file
from smoothing_reference import Smooth, smooth_blocks
from test_llada2_parity import sdar_forward

from dlrt import LLM
from dlrt.errors import OptionError

SHARPEN = 50.0
SDAR_MASK, LLADA2_MASK = 151669, 156895
PROMPT = [9707, 11, 1879, 0, 4021, 315, 279, 1879, 525, 1632, 13, 785, 3974, 13876]


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    """(LLM, reference forward for block length b, E) of the tiny SDAR checkpoint."""
    llm = LLM(tiny_sdar, dtype="float32", device="cpu")
    llm.model.lm_head.weight.data.mul_(SHARPEN)

    def forward_for(b: int):
        ref = sdar_forward(llm, b)
        return lambda embeds, positions: ref(None, positions, embeds)
    return llm, forward_for, llm.model.model.embed_tokens.weight


@pytest.fixture(scope="module")
def llada2(tiny_llada2):
    tensors = load_file(str(tiny_llada2 / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * SHARPEN
    hf = json.loads((tiny_llada2 / "config.json").read_text())
    llm = LLM(tiny_llada2, dtype="float32", device="cpu")
    llm.model.lm_head.weight.data.mul_(SHARPEN)

    def forward_for(b: int):
        return lambda embeds, positions: llada2_reference_forward(
            tensors, hf, None, block_causal_mask(positions, b), embeds)
    return llm, forward_for, tensors["model.word_embeddings.weight"]


def _check(model, mask, p, b, gen, smooth: Smooth, **options):
    llm, forward_for, embed = model
    prompt = PROMPT[:p]
    want = smooth_blocks(forward_for(b), embed, prompt, gen, b, smooth, mask)
    got = llm.generate(prompt, gen, block_length=b, denoising_steps=b, temperature=0.0,
                       ignore_eos=True, **smooth.options(), **options)
    assert got.token_ids == want
    return got


CAPPED = dict(cont_weight=0.5, cont_weight_init=0.2, cont_weight_growth=0.1,
              threshold_decay=0.05)
# (prompt length, block length, generation length, threshold, values): prompts off a block
# boundary (5, 11: a fixed prompt tail in block 0) and on it (8, 4 + 4), a last block cut by
# the generation length; dInfer's defaults and values whose weight reaches its cap and whose
# bar reaches the threshold.
CASES = [(5, 4, 16, 0.5, {}), (8, 8, 24, 0.3, CAPPED), (11, 4, 18, 0.45, CAPPED),
         (4, 8, 20, 0.6, {})]


@pytest.mark.parametrize("mode", ["eager", "host_loop"])
@pytest.mark.parametrize("p,b,gen,threshold,values", CASES)
def test_sdar_smoothing_matches_dinfer(sdar, monkeypatch, mode, p, b, gen, threshold, values):
    if mode != "eager":
        simulate(sdar[0].executor, mode, monkeypatch)
    try:
        _check(sdar, SDAR_MASK, p, b, gen, Smooth(threshold, **values))
    finally:
        sdar[0].executor._graphs.clear()


@pytest.mark.parametrize("strategy", ["credit", "hierarchical"])
@pytest.mark.parametrize("p,b,gen,threshold,values", CASES[:2])
def test_sdar_smoothing_with_dinfer_s_other_decoders(sdar, strategy, p, b, gen, threshold,
                                                    values):
    _check(sdar, SDAR_MASK, p, b, gen, Smooth(threshold, strategy, **values))


@pytest.mark.parametrize("mode", ["eager", "host_loop"])
@pytest.mark.parametrize("p,b,gen,threshold,values,strategy", [
    (6, 8, 24, 0.7, {}, "threshold"), (9, 4, 20, 0.5, CAPPED, "threshold"),
    (8, 8, 16, 0.6, CAPPED, "hierarchical")])
def test_llada2_smoothing_matches_dinfer(llada2, monkeypatch, mode, p, b, gen, threshold,
                                         values, strategy):
    if mode != "eager":
        simulate(llada2[0].executor, mode, monkeypatch)
    try:
        _check(llada2, LLADA2_MASK, p, b, gen, Smooth(threshold, strategy, **values))
    finally:
        llada2[0].executor._graphs.clear()


def test_llada2_family_defaults_with_smoothing(llada2):
    """`smoothing=True` alone: block 32, the `threshold` strategy at 0.95 (the bar decays
    from 1 to it), dInfer's smoothing defaults."""
    llm, forward_for, embed = llada2
    prompt = PROMPT[:6]
    want = smooth_blocks(forward_for(32), embed, prompt, 40, 32, Smooth(0.95), LLADA2_MASK)
    assert llm.generate(prompt, 40, temperature=0.0, ignore_eos=True,
                        smoothing=True).token_ids == want


def test_the_soft_embeddings_are_used(sdar):
    """Some request decodes otherwise with the weights at 0 (the bar still decays)."""
    off = dict(cont_weight=0.0, cont_weight_init=0.0)
    llm = sdar[0]

    def run(p, b, gen, smooth):
        return llm.generate(PROMPT[:p], gen, block_length=b, temperature=0.0, ignore_eos=True,
                            **smooth.options()).token_ids
    assert any(run(p, b, gen, Smooth(t, **v)) != run(p, b, gen, Smooth(t, **{**v, **off}))
               for p, b, gen, t, v in CASES)


@pytest.mark.parametrize("which", ["sdar", "llada2"])
def test_embeds_add(which, request):
    """Zeros change nothing (bit for bit); other values are added to the token embeddings."""
    llm, forward_for, embed = request.getfixturevalue(which)
    runner, c = llm.runner, llm.config
    ids = torch.tensor(PROMPT[:9])
    add = torch.randn(9, c.hidden_size, generator=torch.Generator().manual_seed(0)) * 0.05
    with torch.inference_mode():
        plain = runner.forward_at(ids, 0, chunk_block=4)
        zeros = runner.forward(ids, runner.lens(0, 9), 4, rows=slice(None),
                               embeds_add=torch.zeros(9, c.hidden_size))
        added = runner.forward(ids, runner.lens(0, 9), 4, rows=slice(None), embeds_add=add)
        want = forward_for(4)(embed[ids] + add, torch.arange(9))
    assert torch.equal(zeros, plain)
    assert not torch.allclose(added, plain)
    rel = float((added - want).norm() / want.norm())
    assert rel < 1e-5, rel


def test_refused_combinations_are_named(sdar, llada2):
    llm = sdar[0]
    with pytest.raises(OptionError, match=r"^smoothing=True works only with remasking_strategy "
                                          r"in \('threshold', 'credit', 'hierarchical'\), not "
                                          r"'low_confidence_dynamic'"):
        llm.generate([1, 2], 4, smoothing=True)  # SDAR's default strategy
    with pytest.raises(OptionError, match=r"^smoothing=True works only without token editing"):
        llada2[0].generate([1, 2], 4, smoothing=True, editing_threshold=0.5)
    with pytest.raises(OptionError, match=r"^smoothing=True is not built with tensor "
                                          r"parallelism"):
        from dlrt.runtime.smoothing import SoftFeedback

        class Sharded:  # a runner whose LM head holds a vocabulary shard
            vocab = object()
        SoftFeedback(Sharded(), 4)


def test_the_command_line_takes_newly_allowed_combinations(sdar, tiny_sdar, tiny_llada, capsys):
    """`dlrt generate --smoothing` with the block decoder, and with a canvas cache, gives the
    API's tokens; `--smoothing` needs no strategy flag before the model says its default."""
    import argparse

    from dlrt.entrypoints.cli import add_decoding_flags, decoding_kwargs
    from dlrt.entrypoints.cli import main as cli_main

    parser = argparse.ArgumentParser()
    add_decoding_flags(parser)
    assert decoding_kwargs(parser.parse_args(["--smoothing"]))["smoothing"] is True
    kw = decoding_kwargs(parser.parse_args(["--smoothing", "--canvas-cache", "dual",
                                            "--vicinity-after", "2"]))
    assert kw["canvas_cache"] == "dual" and kw["vicinity_after"] == 2
    flags = ["--smoothing", "--remasking-strategy", "threshold", "--threshold", "0.5",
             "--cont-weight", "0.4", "--max-new-tokens", "8", "--temperature", "0",
             "--ignore-eos", "--json", "--device", "cpu", "--dtype", "float32"]
    options = dict(smoothing=True, remasking_strategy="threshold", threshold=0.5,
                   cont_weight=0.4, temperature=0.0, ignore_eos=True)
    for path, extra, api in ((tiny_sdar, [], {}),
                             (tiny_llada, ["--canvas-cache", "dual", "--vicinity-after", "2",
                                           "--block-length", "4"],
                              dict(canvas_cache="dual", vicinity_after=2, block_length=4))):
        cli_main(["generate", "--model", str(path), "--prompt-ids", "5 6 7", *flags, *extra])
        result = json.loads(capsys.readouterr().out)
        want = LLM(path, dtype="float32", device="cpu").generate([5, 6, 7], 8, **options, **api)
        assert result["token_ids"] == want.token_ids and len(want.token_ids) == 8
