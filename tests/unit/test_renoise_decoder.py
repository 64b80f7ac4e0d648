"""The `renoise` decoder through `LLM` on the tiny DiffusionGemma preset (make-checkpoint's, with
the embedded default model's tokenizer), on the CPU: it is the family's default and fits only
renoising families; text generation, streaming per canvas, reproducibility by seed; the
execution modes commit the same tokens (the graph modes simulated: each captured part replayed
as a call, after the executor's own warm-up); bad options, a mask token and image input are
named errors, non-finite logits a NumericalError; the engine serves the model's windows and
head shapes; a canvas's begin, round and end read no tensor on the host (what a captured WHILE
body needs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cpu_graph_modes import simulate

from dlrt import LLM
from dlrt.errors import NumericalError, OptionError, PromptError
from dlrt.models.registry import family
from dlrt.runtime.decoders import decoder_for
from dlrt.runtime.renoise_decoder import RenoiseDecoder

OPTIONS = dict(max_denoising_steps=6, entropy_bound=0.5, seed=3)


@pytest.fixture(scope="module")
def llm(tiny_diffusion_gemma):
    return LLM(str(tiny_diffusion_gemma), device="cpu", max_model_len=512)


def test_the_family_decodes_with_renoise_and_nothing_else():
    dg, sdar = family("diffusion_gemma"), family("sdar")
    name, defaults = decoder_for(dg, None, None)
    assert name == "renoise" and defaults.renoise and defaults.block_length is None
    assert RenoiseDecoder.supports(dg) is None
    why = RenoiseDecoder.supports(sdar)
    assert why.startswith("decoder 'renoise' does not fit a sdar model: it decodes renoising "
                          "(uniform-state) families")
    with pytest.raises(OptionError, match=r"'block' does not fit a diffusion_gemma model.*"
                                          r"use one of \['renoise'\]$"):
        decoder_for(dg, "block", None)
    with pytest.raises(OptionError, match=r"'renoise' does not fit a llada model.*use one of "
                                          r"\['canvas', 'dllm_var'\]$"):
        decoder_for(family("llada"), "renoise", None)


def test_the_engine_has_no_mask_token_and_serves_windows_and_head_shapes(llm,
                                                                          tiny_diffusion_gemma):
    c = llm.engine_config
    assert (c.decoder, c.mask_token_id, c.attention_backend) == ("renoise", None, "sdpa")
    assert llm.decoder.runner.cache.layer_shapes == llm.config.kv_shapes()
    assert len(set(llm.config.kv_shapes())) == 2
    with pytest.raises(OptionError, match=r"^mask_token_id=3: diffusion_gemma models have no "
                                          r"mask token .*leave it unset$"):
        LLM(str(tiny_diffusion_gemma), device="cpu", mask_token_id=3)
    with pytest.raises(OptionError, match=r"'canvas' does not fit a diffusion_gemma model"):
        LLM(str(tiny_diffusion_gemma), device="cpu", decoder="canvas")


def test_text_in_canvases_reproducible_by_seed(llm):
    r = llm.generate("def fibonacci(n):", max_new_tokens=40, ignore_eos=True, **OPTIONS)
    assert len(r.token_ids) == 40 and r.finish_reason == "length"
    assert r.text.strip()
    assert len(r.denoise_steps) == 3 and all(1 <= s <= 6 for s in r.denoise_steps)  # 16, 16, 8
    canvases = [r.denoise_steps[k] - 1 for k in range(3) for _ in range(16)][:40]
    assert r.commit_rounds == canvases  # a canvas's tokens are its last round's
    t = r.timings
    assert t["rounds"] == sum(r.denoise_steps) and t["forwards"] == t["rounds"] + 1 + 2
    again = llm.generate("def fibonacci(n):", max_new_tokens=40, ignore_eos=True, **OPTIONS)
    assert again.token_ids == r.token_ids
    other = llm.generate("def fibonacci(n):", max_new_tokens=40, ignore_eos=True,
                         **dict(OPTIONS, seed=4))
    assert other.token_ids != r.token_ids
    blocks = list(llm.stream("def fibonacci(n):", max_new_tokens=40, ignore_eos=True, **OPTIONS))
    assert [len(b.token_ids) for b in blocks] == [16, 16, 8]
    assert [t for b in blocks for t in b.token_ids] == r.token_ids
    assert "".join(b.text for b in blocks) == r.text


def test_chat_messages_and_a_stop_id_of_the_checkpoint(llm):
    """The tokenizer's chat template; the checkpoint's eos id (<|endoftext|>, 0) ends the
    request at the canvas holding it."""
    r = llm.generate([{"role": "user", "content": "Reverse a string."}], max_new_tokens=16,
                     **OPTIONS)
    assert r.prompt_token_ids == llm.encode([{"role": "user", "content": "Reverse a string."}])
    assert llm.eos_token_ids == (0,)
    free = llm.generate("x = 1", max_new_tokens=48, ignore_eos=True, **OPTIONS).token_ids
    stop = free[20]
    r = llm.generate("x = 1", max_new_tokens=48, ignore_eos=True, stop=[stop], **OPTIONS)
    assert r.token_ids == free[:free.index(stop)] and r.finish_reason == "stop"
    assert r.stop_reason == stop and len(r.denoise_steps) == free.index(stop) // 16 + 1


@pytest.mark.parametrize("options, error", [
    (dict(max_denoising_steps=0), r"^max_denoising_steps=0 must be in \[1, 1024\]"),
    (dict(entropy_bound=0.0), r"^entropy_bound=0.0 must be a number > 0"),
    (dict(t_min=0.9), r"^t_min=0.9 must be < t_max=0.8"),
    (dict(t_min=0.5, t_max=0.2), r"^t_max=0.2 must be > t_min=0.5"),
    (dict(stability_threshold=-1), r"^stability_threshold=-1 must be in \[0, 2\^63\)"),
    (dict(confidence_threshold=0), r"^confidence_threshold=0.0 must be a number > 0"),
    (dict(max_denoising_steps=2.5), r"^max_denoising_steps must be an integer"),
])
def test_bad_options_are_named_before_any_device_work(llm, options, error, monkeypatch):
    monkeypatch.setattr(llm.decoder, "decode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(OptionError, match=error):
        llm.generate("hi", max_new_tokens=8, **options)


def test_image_input_is_a_named_error(llm, monkeypatch):
    """The image placeholder (here the tokenizer's `<|mask|>`, id 1) in ids or in text."""
    monkeypatch.setattr(llm.decoder, "decode", lambda *a: pytest.fail("decoded"))
    assert llm.config.image_token_id == 1
    for prompt in ([5, 1, 7], "see <|mask|> here"):
        with pytest.raises(PromptError, match=r"image input \(image_token_id 1 at position"):
            llm.generate(prompt, max_new_tokens=8)


@pytest.mark.parametrize("options", [
    dict(max_denoising_steps=6, entropy_bound=0.5),
    dict(max_denoising_steps=8, entropy_bound=1e4, stability_threshold=0,
         confidence_threshold=3.0, t_min=0.05, t_max=0.2),
    dict(max_denoising_steps=5, entropy_bound=1e-3, stability_threshold=2),
])
def test_execution_modes_commit_the_same_tokens(llm, options, monkeypatch):
    prompts = ["import os\n", list(range(100, 140)), [7]]
    out = {}
    for mode in ("eager", "host_loop", "device_loop"):
        with monkeypatch.context() as m:
            if mode != "eager":
                simulate(llm.executor, mode, m)
            before = llm.executor.captures
            out[mode] = [llm.generate(p, max_new_tokens=37, seed=s, ignore_eos=True, **options)
                         for p in prompts for s in (0, 1)]
            assert (llm.executor.captures > before) == (mode != "eager")
            llm.executor._graphs.clear()
    got = {mode: [(r.token_ids, r.denoise_steps, r.commit_rounds) for r in rs]
           for mode, rs in out.items()}
    assert got["host_loop"] == got["eager"] and got["device_loop"] == got["eager"]
    assert all(len(r.token_ids) == 37 and len(r.denoise_steps) == 3 for r in out["eager"])


def test_a_program_serves_every_value_of_a_request(llm):
    """One program (and so one set of captured graphs) for every request: the values live in
    its state on the device, never in its key."""
    llm.generate("a", max_new_tokens=8, **OPTIONS)
    llm.generate("b", max_new_tokens=40, **dict(OPTIONS, max_denoising_steps=3, t_min=0.1,
                                                   entropy_bound=9.0, stability_threshold=0))
    assert [p.key for p in llm.decoder.programs] == [("renoise", 16)]


def test_defaults_and_the_options_without_effect(llm):
    """The reference's defaults (the preset's generation_config.json sets none); mask
    decoding's options are named as having no effect (the request's warning)."""
    from dlrt.decoding.ignored import ignored_options
    from dlrt.decoding.options import DecodingOptions

    opts = DecodingOptions.from_kwargs(dict(block_length=4, temperature=0.5))
    _, params = llm.check("hi", block_length=4, temperature=0.5)
    assert params.renoise is not None
    assert set(ignored_options(opts, params)) == {"block_length", "temperature"}
    assert dataclasses.astuple(params.renoise) == (48, 0.1, 0.4, 0.8, 1, 0.005)


def test_non_finite_logits_end_the_request_with_a_numerical_error(llm):
    """A canvas whose logits are not finite stops at that round (its fault is read back with
    the canvas); the LLM serves the next request."""
    weight = llm.model.model.decoder.norm.weight
    keep = weight.detach().clone()
    with torch.no_grad():
        weight[0] = float("nan")
    try:
        with pytest.raises(NumericalError, match="non-finite logits"):
            llm.generate("x = 1", max_new_tokens=20, **OPTIONS)
    finally:
        with torch.no_grad():
            weight.copy_(keep)
    assert len(llm.generate("x = 1", max_new_tokens=20, **OPTIONS).token_ids) <= 20


def test_a_canvas_reads_nothing_on_the_host(tiny_diffusion_gemma_graphs, monkeypatch):
    """begin (both phases), round and end are pure tensor code, as a captured WHILE body needs:
    with an attention backend that reads the lengths from device memory (`triton`, under
    Triton's interpreter here) no tensor is read on the host."""
    llm = LLM(str(tiny_diffusion_gemma_graphs), device="cpu", max_model_len=128,
              attention_backend="triton")
    _, params = llm.check([2, 3, 4], max_new_tokens=32, **OPTIONS)
    prog = llm.decoder.program()
    prog.state.set_values(params)
    prog.state.set_lens(20, 36)

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")

    with monkeypatch.context() as m, torch.inference_mode():
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero"):
            m.setattr(torch.Tensor, name, host_read)
        prog.begin()
        prog.round()
        prog.end()
        prog.begin_next()
        prog.round()
        prog.end()
    assert prog.state.round.item() == 2 and prog.state.lens.tolist() == [52, 68]


def test_the_triton_ops_give_the_reference_ops_tokens(tiny_diffusion_gemma, llm, monkeypatch):
    """With `kernels="triton"` (Triton's interpreter on the CPU) every round draws through the
    ops table's one-pass kernel (`dlrt.kernels.denoiser`, writing the self-conditioning signal)
    and the soft embeddings, norms and experts run their kernels: the reference ops' tokens,
    canvases and rounds (two canvases: the encoder pass of the first one folded into the
    second's program)."""
    pytest.importorskip("triton")
    from dlrt.ops import triton as triton_ops

    draws = []

    def counted(*args):
        draws.append(args[-1] is not None)  # the self-conditioning buffer to write
        return draw(*args)

    draw = triton_ops._denoiser_draw
    monkeypatch.setattr(triton_ops, "_denoiser_draw", counted)
    kernels = LLM(str(tiny_diffusion_gemma), device="cpu", max_model_len=64, kernels="triton")
    options = dict(max_new_tokens=20, ignore_eos=True, max_denoising_steps=3, entropy_bound=0.5,
                   seed=5)
    want = llm.generate("import os\n", **options)
    got = kernels.generate("import os\n", **options)
    assert (got.token_ids, got.denoise_steps, got.commit_rounds) == \
        (want.token_ids, want.denoise_steps, want.commit_rounds)
    assert len(want.token_ids) == 20 and len(want.denoise_steps) == 2
    assert len(draws) == sum(got.denoise_steps) and all(draws)
