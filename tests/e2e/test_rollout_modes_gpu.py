"""Step maps and logprobs in the three execution modes on the GPU (marked `gpu`): device_loop
(the rounds recorded into the block state's buffers inside the WHILE body, read back once per
block), host_loop and eager give identical tokens, step maps and logprobs for every decoder
family, greedy and sampled (the Triton candidate kernels choose; the logprobs come from the
same logits); a request with logprobs and one without share no program, and the logprob kind's
graphs serve every value."""

from __future__ import annotations

import math

import pytest
import torch

from dlrt import LLM

pytestmark = pytest.mark.gpu

MODES = ("device_loop", "host_loop", "eager")


def _llm(path, **kw):
    llm = LLM(str(path), device="cuda", dtype="bfloat16", **kw)
    model = llm.model
    head = model.lm_head.weight if hasattr(model, "lm_head") else (
        model.model.transformer.ff_out.weight if hasattr(model.model, "transformer") else None)
    if head is not None:
        head.data *= 50  # confidences spread over (0, 1)
    return llm


def _run(llm, prompt, **options):
    out = {}
    for mode in MODES:
        llm.set_execution_mode(mode)
        r = llm.generate(prompt, logprobs=True, top_logprobs=5, **options)
        out[mode] = (r.token_ids, r.denoise_steps, r.step_map, r.logprobs)
    for mode in MODES:
        assert out[mode] == out["eager"], mode
    tokens, _, step_map, logprobs = out["eager"]
    assert [x.token_id for x in logprobs] == tokens and len(step_map) == len(tokens)
    assert all(math.isfinite(x.logprob) for x in logprobs)
    return out["eager"]


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    return _llm(tiny_sdar, max_model_len=4096)


@pytest.fixture(scope="module")
def llada(tiny_llada):
    """A sharpened tiny LLaDA per decoder, made on first use."""
    made = {}

    def get(decoder: str) -> LLM:
        if decoder not in made:
            made[decoder] = _llm(tiny_llada, decoder=decoder, attention_backend="triton",
                                 max_model_len=4096)
        return made[decoder]

    return get


@pytest.mark.parametrize("options", [
    dict(temperature=0, remasking_strategy="low_confidence_dynamic", threshold=0.3),
    dict(temperature=0.8, top_k=50, top_p=0.9, seed=3, remasking_strategy="threshold",
         threshold=0.3),
    dict(temperature=0.7, seed=1, remasking_strategy="credit", threshold=0.3),
])
@pytest.mark.parametrize("prompt_len", [6, 1500])
def test_sdar_modes_identical(sdar, options, prompt_len):
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    _run(sdar, prompt, max_new_tokens=24, ignore_eos=True, **options)


@pytest.mark.parametrize("decoder,options", [
    ("canvas", dict(block_length=8, denoising_steps=4, remasking_strategy="low_confidence_static")),
    ("canvas", dict(block_length=8, denoising_steps=4, canvas_cache="dual",
                    remasking_strategy="threshold", threshold=0.3)),
    ("dllm_var", dict(block_length=8, remasking_strategy="low_confidence_dynamic",
                      threshold=0.3)),
])
@pytest.mark.parametrize("temperature", [0, 0.7])
def test_llada_modes_identical(llada, decoder, options, temperature):
    _run(llada(decoder), list(range(300, 321)), max_new_tokens=24, temperature=temperature,
         seed=2, ignore_eos=True, **options)


def test_llada2_editing_modes_identical(tiny_llada2):
    llm = _llm(tiny_llada2, max_model_len=4096)
    _run(llm, list(range(40, 48)), max_new_tokens=32, block_length=8, temperature=0,
         remasking_strategy="threshold", threshold=0.3, editing_threshold=0.0,
         max_post_steps=2, ignore_eos=True)


def test_diffusion_gemma_modes_identical(tiny_diffusion_gemma_graphs):
    llm = LLM(str(tiny_diffusion_gemma_graphs), device="cuda", dtype="bfloat16",
              max_model_len=4096)
    _, steps, step_map, _ = _run(llm, [3, 4, 5, 6], max_new_tokens=40, max_denoising_steps=6,
                                 entropy_bound=0.5, seed=4, ignore_eos=True)
    assert step_map[:16] == [steps[0] - 1] * 16


def test_logprob_graphs_serve_every_value_and_cost_nothing_when_off(tiny_sdar):
    llm = _llm(tiny_sdar, max_model_len=4096)
    llm.set_execution_mode("device_loop")
    opts = dict(max_new_tokens=16, temperature=0.8, top_k=40, ignore_eos=True)
    off = llm.generate(list(range(20)), seed=1, **opts)
    llm.generate(list(range(20)), seed=1, logprobs=True, top_logprobs=2, **opts)
    captured = llm.executor.captures
    for seed, top, t in ((2, 0, 0.5), (3, 20, 1.3)):
        llm.generate(list(range(30)), seed=seed, logprobs=True, top_logprobs=top,
                     **{**opts, "temperature": t})
    assert llm.executor.captures == captured
    on = llm.generate(list(range(20)), seed=1, logprobs=True, **opts)
    assert (on.token_ids, on.step_map) == (off.token_ids, off.step_map)
    assert [p.state.logprobs is None for p in llm.decoder.programs] == [True, False]
    assert torch.cuda.is_available()
